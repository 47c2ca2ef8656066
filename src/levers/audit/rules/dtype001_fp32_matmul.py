"""DTYPE001 fp32-matmul: large matmuls in fp32 with neither autocast nor TF32.

## What it does
Finds matmuls (mm, addmm, bmm, baddbmm) and convolutions (forward and backward) of at least 1
GFLOP per call that run in float32 while
no autocast is active and TF32 is off (`torch.backends.cuda.matmul.allow_tf32` False and
`float32_matmul_precision` "highest"), when they are at least half of the step's matmul FLOPs
(a few fp32 matmuls in a bf16 step are deliberate; the MATH SDPA backend's fp32 matmuls are
ATTN001's). On a GPU capture this is what ran; on a CPU capture it
fires only when the GPU run is declared to stay in fp32 (`--assume-dtype fp32`), since a CPU
run in fp32 usually becomes bf16 autocast on the GPU. The three lines with the most fp32 matmul
FLOPs are the receipts.

## Why is this bad?
Without tensor cores an fp32 matmul runs at the GPU's non-tensor-core rate: about 67 TFLOP/s on
an H100 against 989 dense bf16 (495 TF32), an order of magnitude slower, and it moves twice the
bytes of bf16.

## Example
```python
logits = model(batch)  # fp32 parameters, no autocast, TF32 off
```

Use instead:
```python
with torch.autocast("cuda", dtype=torch.bfloat16):
    logits = model(batch)
```

## Fix
bf16 autocast (lever `autocast-bf16`), or at least TF32 for fp32 matmuls
(`torch.set_float32_matmul_precision("high")`, lever `tf32-matmul`, not implemented yet).

## Fix safety
Changes numerics: bf16 has an 8-bit mantissa, TF32 a 10-bit one; check loss curves.

## Known problems
FLOPs come from PyTorch's FLOP registry; matmuls it has no formula for are not seen.

## References
- https://pytorch.org/docs/stable/amp.html
- https://pytorch.org/docs/stable/notes/cuda.html#tensorfloat-32-tf32-on-ampere-and-later-devices
"""

from __future__ import annotations

from collections.abc import Iterator

from levers.capture.records import Capture, OpRecord
from levers.audit.config import RuleConfig, low_precision_autocasts
from levers.audit.finding import AlreadyRight, Finding, Part, Work
from levers.audit.patterns import (
    base_name,
    call_op_indices,
    group_by_source,
    meta_text,
    module_pattern,
    receipt,
)
from levers.audit.rules.registry import registered, rule
from levers.vocab import CHANGES_NUMERICS

CODE, NAME = "DTYPE001", "fp32-matmul"
MATMULS = {"mm", "addmm", "bmm", "baddbmm"}
# convolutions run on the same tensor cores under autocast: a convnet in fp32 is this pattern too
CONVOLUTIONS = {"convolution", "convolution_backward", "_convolution", "cudnn_convolution",
                "cudnn_convolution_backward"}
TENSOR_CORE_OPS = MATMULS | CONVOLUTIONS
LARGE_MATMUL_FLOPS = 10**9
FP32_SHARE = 0.5


def tf32_on(capture: Capture) -> bool:
    s = capture.settings
    return bool(s.get("cuda_matmul_allow_tf32")) or s.get(
        "float32_matmul_precision"
    ) in ("high", "medium")


def already_right_autocast(capture: Capture, config: RuleConfig) -> AlreadyRight | None:
    """Low-precision autocast, or most of the step's FLOPs in bf16/fp16."""
    seen = low_precision_autocasts(capture.settings.get("autocast", ()))
    if seen:
        return AlreadyRight("DTYPE001", "mixed-precision autocast", ", ".join(seen))
    matmul = [op for op in capture.ops if op.flops and op.inputs]
    low = sum(
        op.flops for op in matmul if op.inputs[0].dtype in ("bfloat16", "float16")
    )
    total = sum(op.flops for op in matmul)
    if not total or low < 0.5 * total:
        return None
    return AlreadyRight(
        "DTYPE001",
        "low-precision matmuls",
        f"{low / total:.0%} of the step's FLOPs run in bf16/fp16",
    )


def already_right_tf32(capture: Capture, config: RuleConfig) -> AlreadyRight | None:
    """TF32 for the fp32 matmuls on a GPU."""
    if not config.on_gpu or not tf32_on(capture):
        return None
    return AlreadyRight(
        "DTYPE001",
        "TF32 for fp32 matmuls",
        f"float32_matmul_precision={capture.settings.get('float32_matmul_precision')}",
    )


@rule(
    CODE, NAME, severity="high", fix_safety=CHANGES_NUMERICS, levers=("autocast-bf16",),
    already_right=(already_right_autocast, already_right_tf32),
)
def check(capture: Capture, config: RuleConfig) -> Iterator[Finding]:
    # TF32 tensor cores already take fp32 matmuls
    if tf32_on(capture):
        return
    # on a CPU capture the GPU run is assumed to use low precision unless declared fp32
    if not config.on_gpu and config.assumed_dtype is not None:
        return
    # autocast on the GPU casts matmul inputs
    if any(a.startswith("cuda:") for a in capture.settings.get("autocast", ())):
        return
    # the MATH SDPA backend upcasts to fp32 by design: that is ATTN001's finding
    inside_sdpa = call_op_indices(capture, ("sdpa",))
    matmuls = [
        op
        for op in capture.ops
        if base_name(op.name) in TENSOR_CORE_OPS and op.inputs and op.index not in inside_sdpa
    ]
    big = [
        op
        for op in matmuls
        if op.flops >= LARGE_MATMUL_FLOPS
        and all(t.dtype == "float32" for t in op.inputs)
    ]
    # no large fp32 matmul
    if not big:
        return
    # most matmul FLOPs already run in low precision: the fp32 ones are deliberate exceptions
    if sum(op.flops for op in big) < FP32_SHARE * sum(op.flops for op in matmuls):
        return
    yield _finding(big, capture, config)


def _finding(big: list[OpRecord], capture: Capture, config: RuleConfig) -> Finding:
    total = sum(op.flops for op in big)
    all_mm = (
        sum(op.flops for op in capture.ops if base_name(op.name) in TENSOR_CORE_OPS) or total
    )
    convs = sum(1 for op in big if base_name(op.name) in CONVOLUTIONS)
    what = "matmuls" if not convs else (
        "convolutions" if convs == len(big) else "matmuls and convolutions"
    )
    groups = group_by_source(big, lambda op: op.source)
    top = sorted(groups.values(), key=lambda g: -sum(op.flops for op in g))[:3]
    receipts = tuple(
        receipt(
            g[0].source,
            module=module_pattern(op.module for op in g),
            op=g[0].name,
            shapes=" x ".join(meta_text(t) for t in g[0].inputs[-2:]),
            count=len(g),
        )
        for g in top
    )
    num_bytes = sum(op.read_bytes + op.write_bytes for op in big)
    return registered(CODE).finding(
        message=(
            f"{len(big)} fp32 {what} per step ({total / 1e12:.3g} TFLOP, {total / all_mm:.0%} of "
            f"the step's matmul and convolution FLOPs) run without autocast or TF32 on "
            f"{config.gpu.title}: "
            f"{config.gpu.fp32_tflops:g} TFLOP/s fp32 against {config.gpu.bf16_tflops:g} dense bf16."
        ),
        fix_title="Run the forward and backward under torch.autocast('cuda', dtype=torch.bfloat16), or allow TF32",
        receipts=receipts,
        effort="S",
        risk="medium",
        work=Work(
            now=(
                Part(
                    "fp32 matmuls",
                    flops=total,
                    bytes=num_bytes,
                    num_kernels=len(big),
                    dtype="float32",
                ),
            ),
            fixed=(
                Part(
                    "bf16 matmuls",
                    flops=total,
                    bytes=num_bytes // 2,
                    num_kernels=len(big),
                    dtype="bfloat16",
                ),
            ),
            now_ops=tuple(op.index for op in big),
            calls_per_step=len(big),
        ),
        details={"fp32_matmul_flops": total, "num_matmuls": len(big)},
    )
