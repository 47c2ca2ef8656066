"""What the rules reason about besides the capture: the target GPU and the precision assumed.

A rule is a pure function of a Capture and this config. On a GPU capture the config's target is
the GPU that ran (when levers knows it); on a CPU capture it is ``--target`` and the rules decide
what that GPU, running this torch version, would do with the recorded calls.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from levers.capture.records import Capture
from levers.detectors.cost.gpus import GPUS, GpuSpec, spec_for_device_name

DTYPE_ALIASES = {
    "bf16": "bfloat16",
    "bfloat16": "bfloat16",
    "fp16": "float16",
    "float16": "float16",
    "fp32": "float32",
    "float32": "float32",
}
DEFAULT_TARGET = "h100"
DEFAULT_ASSUMED_DTYPE = "bfloat16"


@dataclass(frozen=True)
class RuleConfig:
    """The audit's settings that rules and the cost model read.

    Attributes:
        gpu: the GPU costs are for (the one that ran, on a GPU capture; the target otherwise).
        torch_version: (major, minor) of the torch whose SDPA dispatch rules apply.
        on_gpu: the capture ran on a CUDA device (costs can be measured, backends are known).
        assumed_dtype: on a CPU capture that ran in float32 without autocast, the dtype the GPU
            run is assumed to compute in (the built-in workloads use bf16 autocast on a GPU).
            None on a GPU capture, or when the CPU capture already ran in low precision.
        cudnn_version: cuDNN's version number on a GPU capture (e.g. 91002), else None.
        scopes: (file, function) -> the function's globals and closure, for static checks that
            evaluate guards (MEM002); supplied by the caller that still holds the workload.
    """

    gpu: GpuSpec
    torch_version: tuple[int, int]
    on_gpu: bool
    assumed_dtype: str | None = None
    cudnn_version: int | None = None
    scopes: Mapping[tuple[str, str], Mapping[str, Any]] | None = None

    def compute_dtype(self, recorded: str) -> str:
        """The dtype a recorded float32 tensor would have on the target GPU."""
        if self.assumed_dtype is not None and recorded == "float32":
            return self.assumed_dtype
        return recorded


def parse_torch_version(text: str) -> tuple[int, int]:
    """``"2.11.0+cu128"`` -> ``(2, 11)``."""
    parts = text.split("+")[0].split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        raise ValueError(
            f"torch version {text!r} is not of the form MAJOR.MINOR[.PATCH]; pass e.g. 2.11"
        ) from None


def capture_on_gpu(capture: Capture) -> bool:
    return str(capture.env.get("device", "cpu")).startswith("cuda")


def ran_in_low_precision(capture: Capture) -> bool:
    """Whether the step computed in bf16/fp16 (autocast seen, or half-precision matmuls)."""
    if any(
        a.endswith(("bfloat16", "float16"))
        for a in capture.settings.get("autocast", ())
    ):
        return True
    for op in capture.ops:
        if op.flops and op.inputs and op.inputs[0].dtype in ("bfloat16", "float16"):
            return True
    return False


def make_config(
    capture: Capture,
    *,
    target: str | None = None,
    torch_version: str | None = None,
    assume_dtype: str | None = None,
    cudnn_version: int | None = None,
    scopes: Mapping[tuple[str, str], Mapping[str, Any]] | None = None,
) -> RuleConfig:
    """The config for auditing ``capture``.

    Raises:
        ValueError: an unknown target or dtype, or a malformed torch version.
    """
    if target is not None and target not in GPUS:
        raise ValueError(
            f"--target {target!r} is not known; use one of: {', '.join(GPUS)}"
        )
    on_gpu = capture_on_gpu(capture)
    gpu = None
    if on_gpu:
        gpu = spec_for_device_name(str(capture.env.get("device_name", "")))
    if gpu is None:
        gpu = GPUS[target or DEFAULT_TARGET]
    version = parse_torch_version(
        torch_version or str(capture.env.get("torch", "2.11"))
    )
    assumed = None
    if not on_gpu and not ran_in_low_precision(capture):
        name = assume_dtype or DEFAULT_ASSUMED_DTYPE
        if name not in DTYPE_ALIASES:
            raise ValueError(
                f"--assume-dtype {name!r} is not known; use one of: bf16, fp16, fp32"
            )
        assumed = DTYPE_ALIASES[name]
        if assumed == "float32":
            assumed = None  # the GPU run computes in fp32 as the CPU run did
    return RuleConfig(
        gpu=gpu,
        torch_version=version,
        on_gpu=on_gpu,
        assumed_dtype=assumed,
        cudnn_version=cudnn_version,
        scopes=scopes,
    )
