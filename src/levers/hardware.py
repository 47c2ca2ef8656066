"""The GPUs levers knows: one table, read by every verb, and every name each verb accepts.

Each part carries what the audit prices with (dense tensor-core peaks and HBM bandwidth) and what
the memory model needs (the memory the driver reports, and the compute capability, which decides
the SDPA kernels and workspace sizes).

Compute figures are NVIDIA's datasheet figures for the SXM parts: H100 SXM5 80GB, H200 SXM
141GB, A100 SXM4 80GB and 40GB. Peaks are dense (no structured sparsity); FP32 is the
non-tensor-core rate; TF32 is the dense tensor-core rate for fp32 matmuls when TF32 is allowed.

``total_bytes`` is the device memory that the driver reports (``nvidia-smi``'s total, which is
``torch.cuda.get_device_properties().total_memory``). Not all of it is available to PyTorch: the
CUDA context, cuBLAS/cuDNN handles and the driver keep some for themselves. ``usable_bytes``
subtracts :data:`CONTEXT_BYTES`, an estimate of that share measured on an H200 with torch 2.11
(see ``bench/results/memory_calibration*``); it is what the allocator can reserve before it
raises an out-of-memory error.

Names: a part's ``name`` (``h100-80gb``) is what ``levers memory`` reports; its ``family``
(``h100``) is what ``levers audit`` reports; both, and the ``aliases``, are accepted by
``levers audit --gpu`` (alias ``--target``) and ``levers memory --gpu`` alike
(:func:`resolve_gpu`). ``levers memory --gpu`` also takes a plain memory budget (``40GiB``),
which has no compute figures.
"""

from __future__ import annotations

from dataclasses import dataclass

from levers.units import parse_bytes

MIB = 1 << 20
GIB = 1 << 30

# What the CUDA context and library handles take outside PyTorch's allocator, per process.
CONTEXT_BYTES = 600 * MIB


# the compute capability from which a GPU runs float8 (e4m3/e5m2) matmuls: Ada 8.9; Hopper is 9.0
FLOAT8_MIN_CAPABILITY = (8, 9)

# tensorwise float8 on top of whole-model compile on the H200, where the widest matmul it converts
# has a smaller side of 768 (its other side 3072): 0.935x [0.933, 0.937] tokens/s (nanogpt),
# 0.956x [0.948, 0.969] (the zoo's ViT), 0.931x [0.925, 0.946] (ConvNeXt's MLPs); at 2048 it ran
# 0.98-1.04x (BLOOM, phi, gemma) (bench/results/tune_sweep_h200: s33a, s38, s39, s40a, s40b). The
# peer agrees: torchtitan's recipe on per-layer compile against per-layer compile alone ran 0.84x
# on BERT-base, 0.88x on ViT-B and 0.78x on nanogpt (all 768 wide), 1.00x on phi (2048). Its
# per-tensor scales (an amax over each input, weight and gradient) cost about as much as a narrow
# matmul saves. The float8 lever (its slower_here) and the audit's DTYPE003 read it
FLOAT8_NARROW = 1024
FLOAT8_NARROW_MEASURED = "0.93-0.96x (nanogpt, ViT-B, ConvNeXt: smaller side 768)"


@dataclass(frozen=True)
class GpuSpec:
    """A GPU part, or (for a memory prediction only) a plain memory budget."""

    name: str  # "h100-80gb", or "40GiB" for a plain budget
    total_bytes: int
    sm: tuple[int, int]  # compute capability
    description: str  # the device name the driver reports, "NVIDIA H100 80GB HBM3"
    family: str = ""  # "h100": the audit's name for the part
    title: str = ""  # "NVIDIA H100 SXM": how the audit names the part in prose
    aliases: tuple[str, ...] = ()
    bf16_tflops: float = 0.0  # dense
    fp16_tflops: float = 0.0  # dense
    tf32_tflops: float = 0.0  # dense
    fp32_tflops: float = 0.0  # non-tensor-core
    hbm_gbps: float = 0.0  # GB/s, decimal
    # what CUDA's reduction kernels size their cross-block buffers by
    num_sms: int = 132
    max_threads_per_sm: int = 2048

    @property
    def usable_bytes(self) -> int:
        """What the caching allocator can reserve: the total less the CUDA context."""
        return max(self.total_bytes - CONTEXT_BYTES, 0)

    @property
    def has_compute_figures(self) -> bool:
        """False for a plain memory budget, which cannot price work."""
        return self.hbm_gbps > 0

    @property
    def names(self) -> tuple[str, ...]:
        """Every name that resolves to this part."""
        return tuple(dict.fromkeys((self.name, self.family, *self.aliases)))

    def peak_flops(self, dtype: str, *, tf32: bool = False) -> float:
        """FLOP/s of a matmul in ``dtype`` (float32 uses TF32 tensor cores when allowed)."""
        if dtype == "bfloat16":
            return self.bf16_tflops * 1e12
        if dtype == "float16":
            return self.fp16_tflops * 1e12
        if dtype == "float32" and tf32:
            return self.tf32_tflops * 1e12
        return self.fp32_tflops * 1e12

    @property
    def bandwidth_bytes_per_s(self) -> float:
        return self.hbm_gbps * 1e9


_HOPPER = dict(bf16_tflops=989.4, fp16_tflops=989.4, tf32_tflops=494.7, fp32_tflops=66.9)
_AMPERE = dict(bf16_tflops=312.0, fp16_tflops=312.0, tf32_tflops=156.0, fp32_tflops=19.5)

# nvidia-smi totals of the SXM parts. A family name (h100, a100) stands for its part with the most
# memory.
GPUS = {
    "h100-80gb": GpuSpec(
        "h100-80gb", 81559 * MIB, (9, 0), "NVIDIA H100 80GB HBM3",
        family="h100", title="NVIDIA H100 SXM", aliases=("h100-sxm",),
        hbm_gbps=3350.0, **_HOPPER,
    ),
    "h200": GpuSpec(
        "h200", 143771 * MIB, (9, 0), "NVIDIA H200 141GB HBM3e",
        family="h200", title="NVIDIA H200 SXM", aliases=("h200-141gb", "h200-sxm"),
        hbm_gbps=4800.0, **_HOPPER,
    ),
    "a100-80gb": GpuSpec(
        "a100-80gb", 81920 * MIB, (8, 0), "NVIDIA A100-SXM4-80GB",
        family="a100", title="NVIDIA A100 SXM", aliases=("a100-sxm",),
        hbm_gbps=2039.0, num_sms=108, **_AMPERE,
    ),
    "a100-40gb": GpuSpec(
        "a100-40gb", 40960 * MIB, (8, 0), "NVIDIA A100-SXM4-40GB",
        family="a100-40gb", title="NVIDIA A100 SXM 40GB",
        hbm_gbps=1555.0, num_sms=108, **_AMPERE,
    ),
}

_BY_NAME = {n: spec for spec in GPUS.values() for n in spec.names}
assert len(_BY_NAME) == sum(len(s.names) for s in GPUS.values()), "a GPU name is used twice"

# the GPU a CPU run is estimated (audit) or predicted (memory) for when none is named: one part
# for both verbs, so that their figures agree; named by its part name, which the family name h100
# stands for
DEFAULT_GPU = "h100-80gb"


def gpu_names() -> tuple[str, ...]:
    """Every GPU name accepted, parts first (``h100-80gb``), then families and aliases."""
    return tuple(dict.fromkeys([*GPUS, *_BY_NAME]))


def lookup_gpu(text: str) -> GpuSpec | None:
    """The part that ``text`` names (any of its names, any case), or None."""
    return _BY_NAME.get(str(text).strip().lower())


def resolve_gpu(text: str | GpuSpec, *, allow_budget: bool = True, option: str = "--gpu") -> GpuSpec:
    """A GPU by any of its names (``h100-80gb``, ``h100``, ``h200``, ``a100``, ``a100-40gb``, ...)
    or, when ``allow_budget``, a plain memory budget (``40GiB``), which is taken as an sm90 device
    whose allocator may reserve exactly that much (no context is subtracted from a budget).

    Raises:
        ValueError: neither a known GPU nor (when allowed) a memory budget; the message names
            ``option``.
    """
    if isinstance(text, GpuSpec):
        return text
    spec = lookup_gpu(text)
    if spec is not None:
        return spec
    if not allow_budget:
        raise ValueError(f"{option} {text!r} is not known; use one of: {', '.join(gpu_names())}")
    try:
        budget = parse_bytes(str(text), unit_required=True)
    except ValueError:
        raise ValueError(
            f"{option} {text!r} is not a known GPU or a memory budget; use one of "
            f"{', '.join(GPUS)} or a size like 40GiB"
        ) from None
    if budget <= 0:
        raise ValueError(f"{option} {text!r} must be a positive memory budget")
    name = "".join(str(text).split())
    return GpuSpec(
        name=name,
        total_bytes=budget + CONTEXT_BYTES,
        sm=(9, 0),
        description=f"a {name} budget (sm90 kernels assumed)",
    )


def gpu_from_device_name(device_name: str) -> GpuSpec | None:
    """The part that ``torch.cuda.get_device_name()`` names ("NVIDIA H200" -> h200), or None."""
    name = device_name.lower()
    if "h200" in name:
        return GPUS["h200"]
    if "h100" in name:
        return GPUS["h100-80gb"]
    if "a100" in name:
        return GPUS["a100-40gb"] if "40gb" in name else GPUS["a100-80gb"]
    return None
