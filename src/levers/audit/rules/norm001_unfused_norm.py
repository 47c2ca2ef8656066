"""NORM001 unfused-norm: RMSNorm or LayerNorm written as a chain of elementwise ops.

## What it does
Finds normalisations computed op by op (pow, mean, add, rsqrt, mul, casts; or mean, sub, var,
sqrt, div for LayerNorm) outside any `F.rms_norm`/`F.layer_norm` call, and reports the kernels
and bytes per call (forward and backward) and the number of calls per step.

## Why is this bad?
Each op of the chain is a kernel that reads and writes the whole [.., H] activation, often in
fp32, and autograd keeps several of the intermediates for backward. A fused norm does one pass
forward and one backward. Norms run two or more times per layer, so the chain adds up to many
small memory-bound kernels per step, and its fp32 intermediates inflate activation memory.

## Example
```python
def rms_norm(x, weight, eps):
    return weight * (x.float() * (x.float().pow(2).mean(-1, keepdim=True) + eps).rsqrt()).to(x.dtype)
```

Use instead:
```python
def rms_norm(x, weight, eps):
    return F.rms_norm(x, weight.shape, weight.to(x.dtype), eps)
```

## Fix
`F.rms_norm` (lever `rms-norm-fused`) or `F.layer_norm` (lever `layer-norm-fused`, not implemented yet); a regional compile of each block
(lever `compile-blocks`) or of the whole model (lever `compile-model`) fuses either; on a GPU, Liger
Kernel's RMSNorm (lever `liger-kernels`).

## Fix safety
Changes numerics: the fused kernel reduces in a different order and may keep fewer fp32
intermediates. Where a parity suite pins bitwise equality, land it behind a switch with a parity
re-gate.

## Known problems
Matched by op names and shapes: a keepdim reduction over the last dimension followed by a
(r)sqrt within six ops, in one module and source function. A norm spread over several functions,
or one whose reduction is a `sum` divided by H, is missed.

## References
- https://pytorch.org/docs/stable/generated/torch.nn.functional.rms_norm.html
- Zhang and Sennrich, Root Mean Square Layer Normalization (2019), https://arxiv.org/abs/1910.07467
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from levers.capture.records import Capture
from levers.audit.config import RuleConfig
from levers.audit.cost.roofline import dtype_size
from levers.audit.finding import AlreadyRight, Finding, Part, Work
from levers.audit.pattern_view import pattern_view
from levers.audit.patterns import (
    fmt_bytes,
    group_by_source,
    line_span,
    meta_text,
    module_pattern,
    num_kernels,
    receipt,
    sum_bytes,
    with_backward,
)
from levers.audit.patterns_norm import NormChain
from levers.audit.rules.registry import registered, rule
from levers.vocab import CHANGES_NUMERICS

CODE, NAME = "NORM001", "unfused-norm"


def already_right(capture: Capture, config: RuleConfig) -> AlreadyRight | None:
    """Norms called as F.layer_norm / F.rms_norm / F.group_norm."""
    names = Counter(c.name for c in capture.calls if c.kind == "norm")
    if not names:
        return None
    return AlreadyRight(
        "NORM001",
        "fused norms",
        ", ".join(f"{n} x{k}" for n, k in sorted(names.items())),
    )


@rule(
    CODE,
    NAME,
    severity="medium",
    fix_safety=CHANGES_NUMERICS,
    levers=(
        "rms-norm-fused", "layer-norm-fused", "compile-blocks", "liger-kernels", "compile-model",
    ),
    already_right=(already_right,),
)
def check(capture: Capture, config: RuleConfig) -> Iterator[Finding]:
    view = pattern_view(capture)
    chains = view.unfused_norms
    # every norm is a fused op (or there is none)
    if not chains:
        return
    backward = view.backward
    ops = capture.ops
    for group in group_by_source(chains, lambda c: ops[c.reduction].source).values():
        yield _finding(group, capture, config, backward)


def fused_norm_parts(
    meta_shape: tuple[int, ...], dtype: str, kind: str
) -> tuple[Part, ...]:
    """One fused norm, forward and backward, at this shape."""
    size = dtype_size(dtype)
    numel = 1
    for d in meta_shape:
        numel *= d
    label = "F.rms_norm" if kind == "RMSNorm" else "F.layer_norm"
    return (
        Part(f"{label} forward", bytes=2 * numel * size, num_kernels=1),
        Part(f"{label} backward", bytes=3 * numel * size, num_kernels=2),
    )


def _finding(
    group: list[NormChain], capture: Capture, config: RuleConfig, backward
) -> Finding:
    ops = capture.ops
    first = group[0]
    reduction = ops[first.reduction]
    count = len(group)
    per_call_fwd = [ops[i] for i in first.ops]
    all_now = with_backward([i for c in group for i in c.ops], backward)
    every_op = [ops[i] for i in all_now]
    # per call: averaged over the calls (the first block's backward may stop at a leaf input)
    fwd_kernels = num_kernels(per_call_fwd)
    all_kernels = round(num_kernels(every_op) / count)
    bytes_per_call = sum_bytes(every_op) // count
    shapes = Counter(meta_text(c.input) for c in group)
    start, end = (
        line_span(per_call_fwd, reduction.source.file) if reduction.source else (0, 0)
    )
    dtype = config.compute_dtype(first.input.dtype)
    message = (
        f"{first.kind} written as {fwd_kernels} forward kernels ({all_kernels} with backward) "
        f"moving {fmt_bytes(bytes_per_call)} per call, {count}x per step on "
        + ", ".join(f"{shape} x{n}" for shape, n in shapes.items())
        + "."
    )
    fused = "F.rms_norm" if first.kind == "RMSNorm" else "F.layer_norm"
    fixed = tuple(
        p for c in group for p in fused_norm_parts(c.input.shape, dtype, c.kind)
    )
    src = reduction.source
    return registered(CODE).finding(
        message=message,
        fix_title=f"Use {fused} (one kernel forward, one backward) with the same weight and eps",
        receipts=(
            receipt(
                src,
                module=module_pattern(ops[c.reduction].module for c in group),
                op=" -> ".join(_names(per_call_fwd)),
                shapes=", ".join(shapes),
                count=count,
                end_line=end if end != start else None,
            ),
        ),
        effort="S",
        risk="medium",
        lever="rms-norm-fused" if first.kind == "RMSNorm" else "layer-norm-fused",
        work=Work(
            fixed=fixed,
            now_ops=all_now,
            calls_per_step=count,
            bench={
                "kind": "norm",
                "norm": first.kind,
                "calls": [
                    {"shape": list(c.input.shape), "count": n}
                    for c, n in _first_by_shape(group)
                ],
                # the dtype the norm is applied to (the chain may upcast before its reduction)
                "dtype": next(
                    (t.dtype for t in ops[first.ops[0]].inputs), first.input.dtype
                ),
            },
        ),
        details={
            "levers": [
                "rms-norm-fused" if first.kind == "RMSNorm" else "layer-norm-fused",
                "compile-blocks",
            ],
            "kind": first.kind,
            "kernels_per_call_forward": fwd_kernels,
            "kernels_per_call": all_kernels,
            "bytes_per_call": bytes_per_call,
            "calls_per_step": count,
        },
    )


def _first_by_shape(group: list[NormChain]):
    counts = Counter(meta_text(c.input) for c in group)
    seen = {}
    for c in group:
        seen.setdefault(meta_text(c.input), c)
    return [(seen[k], counts[k]) for k in counts]


def _names(ops) -> list[str]:
    return [op.name.split(".")[1] for op in ops if not op.is_view]
