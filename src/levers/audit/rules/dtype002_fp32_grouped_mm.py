"""DTYPE002 fp32-grouped-mm: grouped matmuls (a mixture of experts' experts) in fp32 under autocast.

## What it does
Finds grouped matmuls, `torch._grouped_mm` (what `F.grouped_mm` runs) and the
`grouped_mm_fallback` custom op that transformers runs in their place under torch.compile
(in any namespace, with its backward), whose floating-point operands are all float32 while
low-precision autocast (bf16 or fp16) is on for their device. It fires when they add up to at
least 1 GFLOP per step and at least 10% of the step's counted FLOPs. The three lines with the
most fp32 grouped-matmul FLOPs are the receipts.

## Why is this bad?
`torch._grouped_mm` is not on autocast's cast list. With fp32 master weights, Hugging Face's
mixture-of-experts code casts the activations up to the weights' dtype
(`F.grouped_mm(input.to(weight.dtype), weight, offs=offs)`), so every expert GEMM, forward and
backward, runs in fp32 while the rest of the step runs in bf16: on an H100 about 67 TFLOP/s
against 989 dense bf16, and twice the bytes. On an H200 the experts of a Mixtral-shaped model
were 78% of the step; casting both operands to bf16 ran the whole step 2.22x faster
(bench/results/moe_h200/README.md).

## Example
```python
with torch.autocast("cuda", dtype=torch.bfloat16):  # fp32 parameters
    out = torch._grouped_mm(x.to(w.dtype), w, offs=offs)  # runs in fp32
```

Use instead:
```python
with torch.autocast("cuda", dtype=torch.bfloat16):
    dtype = torch.get_autocast_dtype("cuda")
    out = torch._grouped_mm(x.to(dtype), w.to(dtype), offs=offs)  # bf16, as a linear's
```

## Fix
Cast the grouped matmul's operands to autocast's dtype while autocast is on, as autocast casts a
linear's (lever `grouped-mm-autocast`). Keeping the weights themselves in bf16 does it too, at
the price of bf16 master weights.

## Fix safety
Changes numerics: the experts' GEMMs run in bf16 (8-bit mantissa) or fp16 with fp32
accumulation, as the step's other matmuls already do under autocast; check loss curves.

## Known problems
The autocast state is the step's, not each op's: a grouped matmul run outside the autocast
region of a step that enters it elsewhere is counted too; and the capture reads it when a module,
a loss, attention or a norm is called, so an autocast region that calls none is not seen. A CPU
capture that ran in fp32 is judged as its GPU run under the assumed autocast (`--assume-dtype`,
bf16 by default; `fp32` says the GPU run has none). The capture counts no FLOPs for the
`grouped_mm_fallback` custom op; they are counted here from its operands' shapes (its backward
as two grouped matmuls). Whether the grouped kernel uses TF32 for fp32 when TF32 is allowed is
not checked: the fp32 part is priced with TF32 when it is allowed, the smaller saving.

## References
- https://pytorch.org/docs/stable/amp.html
- https://github.com/pytorch/pytorch/issues/174763 (cited by transformers' `integrations/moe.py`
  where it casts the input to the weights' dtype, since grouped_mm is not autocast-enabled)
"""

from __future__ import annotations

from collections.abc import Iterator

from levers.capture.records import Capture, OpRecord, SourceLoc
from levers.audit.config import RuleConfig
from levers.audit.finding import Finding, Part, Work
from levers.audit.patterns import (
    FLOAT_DTYPES,
    group_by_source,
    meta_text,
    module_pattern,
    receipt,
)
from levers.audit.rules.registry import registered, rule
from levers.vocab import CHANGES_NUMERICS

CODE, NAME = "DTYPE002", "fp32-grouped-mm"
# op names without namespace and overload: torch's grouped GEMM and transformers' per-expert
# custom op (its backward computes the input's and the weights' gradients)
GROUPED_MM = "_grouped_mm"
FALLBACK = "grouped_mm_fallback"
FALLBACK_BACKWARD = "grouped_mm_fallback_backward"
GROUPED_OPS = (GROUPED_MM, FALLBACK, FALLBACK_BACKWARD)
LOW_PRECISION = ("bfloat16", "float16")
MIN_FLOPS = 10**9  # per step, all fp32 grouped matmuls together
MIN_SHARE = 0.1  # of the step's counted FLOPs


def _op_name(op: OpRecord) -> str:
    """``"aten._grouped_mm.default"`` -> ``"_grouped_mm"``;
    ``"transformers.grouped_mm_fallback.default"`` -> ``"grouped_mm_fallback"``."""
    parts = op.name.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _flops(op: OpRecord) -> int:
    """The op's FLOPs: the capture's, or, for the custom op it has no formula for, the grouped
    matmul's of its (input, weight) shapes (twice that for its backward)."""
    if op.flops or _op_name(op) == GROUPED_MM or len(op.inputs) < 2:
        return op.flops
    # imported here: levers.capture.ops imports torch, which `levers rule` must not
    from levers.capture.ops import grouped_mm_flops

    flops = grouped_mm_flops(op.inputs[0].shape, op.inputs[1].shape)
    return 2 * flops if _op_name(op) == FALLBACK_BACKWARD else flops


def _num_kernels(op: OpRecord) -> int:
    """One grouped GEMM; the custom op runs one matmul per expert (two in its backward)."""
    if _op_name(op) == GROUPED_MM or len(op.inputs) < 2 or len(op.inputs[1].shape) != 3:
        return 1
    num_experts = op.inputs[1].shape[0]
    return 2 * num_experts if _op_name(op) == FALLBACK_BACKWARD else num_experts


def _autocast_dtypes(capture: Capture) -> dict[str, str]:
    """Device type -> the low-precision dtype autocast was on with (``"cpu:bfloat16"``)."""
    found: dict[str, str] = {}
    for entry in capture.settings.get("autocast", ()):
        device, _, dtype = str(entry).partition(":")
        if dtype in LOW_PRECISION:
            found.setdefault(device, dtype)
    return found


def _fp32_operands(op: OpRecord) -> bool:
    floats = [t for t in op.inputs if t.dtype in FLOAT_DTYPES]
    return bool(floats) and all(t.dtype == "float32" for t in floats)


def _device_type(op: OpRecord) -> str:
    return op.inputs[0].device.split(":")[0]


@rule(CODE, NAME, severity="high", fix_safety=CHANGES_NUMERICS, levers=("grouped-mm-autocast",))
def check(capture: Capture, config: RuleConfig) -> Iterator[Finding]:
    autocast = _autocast_dtypes(capture)
    # a CPU capture that ran in fp32: its GPU run is assumed to autocast (--assume-dtype), and
    # autocast would leave the grouped matmuls as they are here
    assumed = not autocast and not config.on_gpu and config.assumed_dtype in LOW_PRECISION
    if assumed:
        autocast = {"cpu": config.assumed_dtype}
    # no low-precision autocast: the step computes in fp32 by choice, grouped matmuls included
    if not autocast:
        return
    fp32 = [
        op
        for op in capture.ops
        if _op_name(op) in GROUPED_OPS
        and op.inputs
        and _fp32_operands(op)
        and _device_type(op) in autocast
    ]
    # no grouped matmul ran in fp32 under autocast
    if not fp32:
        return
    flops = sum(_flops(op) for op in fp32)
    # the capture counts no FLOPs for the custom op: add them to the step's
    step_flops = sum(op.flops for op in capture.ops) + sum(
        _flops(op) - op.flops for op in fp32
    )
    # too little work to matter, or a small part of a step dominated by other work
    if flops < MIN_FLOPS or flops < MIN_SHARE * step_flops:
        return
    yield _finding(
        fp32, flops, step_flops, autocast[_device_type(fp32[0])], capture, config, assumed
    )


def _sources(fp32: list[OpRecord], capture: Capture) -> dict[int, SourceLoc | None]:
    """Op index -> the line of each op. A backward op has the line of the forward op the capture
    tied it to; the capture does not tie the custom op's backward (its autograd node carries no
    tag), so that op takes the line of the forward grouped matmul whose input and weight it
    received."""
    by_operands = {
        op.inputs[:2]: op.source
        for op in fp32
        if op.phase == "forward" and op.source is not None
    }
    found: dict[int, SourceLoc | None] = {}
    for op in fp32:
        source = op.source
        if source is None and op.forward_op is not None:
            source = capture.ops[op.forward_op].source
        if source is None:
            source = by_operands.get(op.inputs[:2])
        found[op.index] = source
    return found


def _finding(
    fp32: list[OpRecord],
    flops: int,
    step_flops: int,
    autocast_dtype: str,
    capture: Capture,
    config: RuleConfig,
    assumed: bool,
) -> Finding:
    sources = _sources(fp32, capture)
    groups = group_by_source(fp32, lambda op: sources[op.index])
    top = sorted(groups.values(), key=lambda g: -sum(_flops(op) for op in g))[:3]
    receipts = tuple(
        receipt(
            sources[g[0].index],
            module=module_pattern(op.module for op in g),
            op=g[0].name,
            shapes=" x ".join(meta_text(t) for t in g[0].inputs[:2]),
            count=len(g),
        )
        for g in top
    )
    num_bytes = sum(op.read_bytes + op.write_bytes for op in fp32)
    num_kernels = sum(_num_kernels(op) for op in fp32)
    # the fix casts each expert weight to the autocast dtype in the forward (read 4 bytes, write
    # 2) and the weight's gradient back to fp32 (read 2, write 4)
    weights = [
        op.inputs[1]
        for op in fp32
        if op.phase == "forward" and not op.recompute and len(op.inputs[1].shape) == 3
    ]
    cast_bytes = sum(12 * w.numel for w in weights)
    names = {_op_name(op) for op in fp32}
    uncast = " or ".join(
        text
        for text, present in (
            ("torch._grouped_mm", GROUPED_MM in names),
            ("the grouped_mm_fallback custom op", bool(names - {GROUPED_MM})),
        )
        if present
    )
    low = "bf16" if autocast_dtype == "bfloat16" else "fp16"
    tf32 = bool(capture.settings.get("cuda_matmul_allow_tf32"))
    # the custom op's backward is two grouped matmuls (the input's and the weights' gradients)
    num_matmuls = sum(2 if _op_name(op) == FALLBACK_BACKWARD else 1 for op in fp32)
    return registered(CODE).finding(
        message=(
            f"{num_matmuls} grouped matmuls per step ({flops / 1e12:.3g} TFLOP, "
            f"{flops / step_flops:.0%} of the step's FLOPs) "
            + (
                f"ran in fp32 on this CPU and would stay fp32 under the GPU run's {low} autocast "
                "(assumed; --assume-dtype fp32 if it runs without autocast): "
                if assumed
                else f"run in fp32 under {low} autocast: "
            )
            + f"autocast does not cast {uncast}, so with fp32 weights the experts run in "
            f"fp32 on {config.gpu.title}: {config.gpu.fp32_tflops:g} TFLOP/s fp32 against "
            f"{config.gpu.peak_flops(autocast_dtype) / 1e12:g} dense {low}."
        ),
        fix_title=(
            "Cast the grouped matmul's operands to the autocast dtype (lever grouped-mm-autocast)"
        ),
        receipts=receipts,
        effort="S",
        risk="medium",
        work=Work(
            now=(
                Part(
                    "fp32 grouped matmuls",
                    flops=flops,
                    bytes=num_bytes,
                    num_kernels=num_kernels,
                    dtype="float32",
                    tf32=tf32,
                ),
            ),
            fixed=(
                Part(
                    f"{low} grouped matmuls",
                    flops=flops,
                    bytes=num_bytes // 2,
                    num_kernels=num_kernels,
                    dtype=autocast_dtype,
                ),
                Part("expert weight casts", bytes=cast_bytes, num_kernels=2 * len(weights)),
            ),
            now_ops=tuple(op.index for op in fp32),
            calls_per_step=len(fp32),
        ),
        details={
            "fp32_grouped_mm_flops": flops,
            "num_grouped_mms": num_matmuls,
            "autocast_dtype": autocast_dtype,
        },
    )
