"""Target GPUs: how much memory the caching allocator can reserve on each, and the facts about
the chip that change what a step allocates (its compute capability).

``total_bytes`` is the device memory that the driver reports (``nvidia-smi``'s total, which is
``torch.cuda.get_device_properties().total_memory``). Not all of it is available to PyTorch: the
CUDA context, cuBLAS/cuDNN handles and the driver keep some for themselves. ``usable_bytes``
subtracts :data:`CONTEXT_BYTES`, an estimate of that share measured on an H200 with torch 2.11
(see ``bench/results/memory_calibration*``); it is what the allocator can reserve before it
raises an out-of-memory error.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MIB = 1 << 20
GIB = 1 << 30

# What the CUDA context and library handles take outside PyTorch's allocator, per process.
CONTEXT_BYTES = 600 * MIB


@dataclass(frozen=True)
class GpuSpec:
    """A target GPU for a memory prediction."""

    name: str  # "h100-80gb", or "40GiB" for a plain budget
    total_bytes: int
    sm: tuple[int, int]  # compute capability; decides the SDPA kernels and workspace sizes
    description: str

    @property
    def usable_bytes(self) -> int:
        """What the caching allocator can reserve: the total less the CUDA context."""
        return max(self.total_bytes - CONTEXT_BYTES, 0)


# nvidia-smi totals of the SXM parts.
GPUS = {
    "h100-80gb": GpuSpec("h100-80gb", 81559 * MIB, (9, 0), "NVIDIA H100 80GB HBM3"),
    "h200": GpuSpec("h200", 143771 * MIB, (9, 0), "NVIDIA H200 141GB HBM3e"),
    "a100-80gb": GpuSpec("a100-80gb", 81920 * MIB, (8, 0), "NVIDIA A100-SXM4-80GB"),
    "a100-40gb": GpuSpec("a100-40gb", 40960 * MIB, (8, 0), "NVIDIA A100-SXM4-40GB"),
}

_BUDGET = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(GiB|GB|MiB)\s*$", re.IGNORECASE)


def resolve_gpu(text: str | GpuSpec) -> GpuSpec:
    """A GPU by name (``h100-80gb``, ``h200``, ``a100-80gb``, ``a100-40gb``) or a plain memory
    budget (``40GiB``), which is taken as an sm90 device whose allocator may reserve exactly
    that much (no context is subtracted from a budget)."""
    if isinstance(text, GpuSpec):
        return text
    key = str(text).strip().lower()
    if key in GPUS:
        return GPUS[key]
    match = _BUDGET.match(str(text))
    if match is None:
        raise ValueError(
            f"--gpu {text!r} is not a known GPU or a memory budget; use one of "
            f"{', '.join(GPUS)} or a size like 40GiB"
        )
    amount, unit = float(match.group(1)), match.group(2).lower()
    scale = {"gib": GIB, "gb": 10**9, "mib": MIB}[unit]
    budget = int(amount * scale)
    if budget <= 0:
        raise ValueError(f"--gpu {text!r} must be a positive memory budget")
    return GpuSpec(
        name=f"{match.group(1)}{match.group(2)}",
        total_bytes=budget + CONTEXT_BYTES,
        sm=(9, 0),
        description=f"a {match.group(1)} {match.group(2)} budget (sm90 kernels assumed)",
    )


def gpu_from_device_name(device_name: str) -> GpuSpec | None:
    """The spec of a GPU that ``torch.cuda.get_device_name()`` names, if it is a known one."""
    name = device_name.lower()
    if "h200" in name:
        return GPUS["h200"]
    if "h100" in name:
        return GPUS["h100-80gb"]
    if "a100" in name:
        return GPUS["a100-40gb"] if "40gb" in name else GPUS["a100-80gb"]
    return None
