"""The whole step priced on the target GPU (CPU captures), and its MFU.

    MFU = model FLOPs per step / step time / dense bf16 peak of the GPU

Model FLOPs are the forward and backward FLOPs PyTorch's FLOP registry counts over the step's
aten ops (matmuls and attention), without the ops re-run by activation checkpointing, as MFU is
usually defined; the optimizer's elementwise work counts no FLOPs.
"""

from __future__ import annotations

from levers.capture.records import Capture
from levers.audit.config import RuleConfig
from levers.audit.cost import roofline


def model_flops(capture: Capture) -> int:
    return sum(
        op.flops
        for op in capture.ops
        if op.phase in ("forward", "backward") and not op.recompute
    )


def estimated_step_us(capture: Capture, config: RuleConfig) -> float:
    return roofline.ops_us(
        capture.ops,
        config.gpu,
        assumed_dtype=config.assumed_dtype,
        tf32=bool(capture.settings.get("cuda_matmul_allow_tf32")),
    )


def mfu(flops: int, step_s: float, peak_flops: float) -> float | None:
    if step_s <= 0 or peak_flops <= 0:
        return None
    return flops / step_s / peak_flops


MFU_FORMULA = (
    "MFU = forward+backward FLOPs counted by PyTorch's FLOP registry over the step's aten ops "
    "(recomputation excluded) / step time / dense bf16 peak of {gpu} ({peak:g} TFLOP/s)"
)
