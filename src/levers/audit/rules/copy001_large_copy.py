"""COPY001 large-copy: clones, cats, contiguous copies and copy_ of large tensors, by source line.

## What it does
Reports two kinds of copies in the forward pass, one finding per source line:

- a `clone` whose next use is an in-place scatter (`index_put_`, `scatter_`, `masked_scatter_`,
  `index_copy_`, `copy_`) into it, when the cloned tensor was made earlier in the step (a
  non-leaf): the scatter could write into the original, whatever the size;
- a user-level `clone`, `contiguous`, `cat` or `copy_` that writes at least 64 MiB in one call.

Copies that PyTorch makes inside a reshape (a `clone` followed by `_unsafe_view` on the same
line) are not user-level copies and are not reported.

## Why is this bad?
A copy reads and writes the whole tensor and holds a second copy alive, often until backward.
Cloning a fresh activation only to scatter into it doubles the memory and traffic of that
tensor for nothing: autograd handles an in-place write into a non-leaf that is not needed for
backward.

## Example
```python
prefix = embeddings.clone()
prefix[rows, cols] = image_features
```

Use instead:
```python
prefix = embeddings  # a fresh embedding output; autograd does not need it back
prefix[rows, cols] = image_features
```

## Fix
Scatter in place into the fresh tensor (lever `inplace-scatter`); build
large concatenations once or write into a preallocated buffer; drop `contiguous()` where the
consumer accepts strided input.

## Fix safety
Exact: the values are the same. If autograd needs the original (it is saved for backward of an
earlier op), the in-place write raises at backward, which a one-step parity test catches.

## Known problems
The capture does not record tensor identities, so "the clone's next use is a scatter" means the
next in-place op that takes a tensor of the clone's shape and dtype within 32 ops of the same
source function (the scatter may write through a view of the clone). Copies in the backward pass are PyTorch's and are not reported.

## References
- https://pytorch.org/docs/stable/notes/autograd.html#in-place-operations-with-autograd
"""

from __future__ import annotations

from collections.abc import Iterator

from levers.capture.records import Capture, OpRecord
from levers.audit.config import RuleConfig
from levers.audit.finding import AlreadyRight, Finding, Work
from levers.audit.pattern_view import pattern_view
from levers.audit.patterns import (
    base_name,
    call_op_indices,
    fmt_bytes,
    group_by_source,
    meta_text,
    module_pattern,
    receipt,
    with_backward,
)
from levers.audit.rules.registry import registered, rule
from levers.vocab import EXACT

CODE, NAME = "COPY001", "large-copy"
LARGE_COPY_BYTES = 64 * 2**20
SCATTER_WINDOW = 32
SCATTERS = {
    "index_put_",
    "scatter_",
    "masked_scatter_",
    "index_copy_",
    "copy_",
    "index_add_",
    "scatter_add_",
}
COPIES = {"clone", "cat", "copy_"}


def is_reshape_copy(ops: tuple[OpRecord, ...], op: OpRecord) -> bool:
    """A clone that PyTorch made inside reshape/einsum (followed by _unsafe_view on its line)."""
    nxt = ops[op.index + 1] if op.index + 1 < len(ops) else None
    return (
        nxt is not None
        and base_name(nxt.name) == "_unsafe_view"
        and nxt.source == op.source
    )


def clone_scatter_target(ops: tuple[OpRecord, ...], clone: OpRecord) -> OpRecord | None:
    """The in-place scatter into the clone's output (or a view of it), if that is its next use.

    Ops computing the scattered values may run in between; an op that reads a tensor of the
    clone's exact shape and dtype first means the clone has another use.
    """
    out = clone.outputs[0]
    for op in ops[clone.index + 1 : clone.index + 1 + SCATTER_WINDOW]:
        if op.phase != clone.phase or op.source is None or clone.source is None:
            return None
        if (
            op.source.file != clone.source.file
            or op.source.function != clone.source.function
        ):
            return None
        if not op.inputs or op.is_view:
            continue
        first = op.inputs[0]
        if op.is_inplace and base_name(op.name) in SCATTERS:
            fits = (
                first.dtype == out.dtype
                and first.shape[-1:] == out.shape[-1:]
                and first.numel <= out.numel
            )
            return op if fits else None
        if first.shape == out.shape and first.dtype == out.dtype:
            return None  # read by something else first
    return None


def made_in_step(ops: tuple[OpRecord, ...], clone: OpRecord) -> bool:
    """Whether the cloned tensor is an output of an earlier op of the step (a non-leaf)."""
    src = clone.inputs[0]
    return any(
        not op.is_view and src in op.outputs
        for op in ops[max(0, clone.index - 64) : clone.index]
    )


def already_right(capture: Capture, config: RuleConfig) -> AlreadyRight | None:
    """No needless copy, and the in-place scatters that write into fresh tensors."""
    scatters = sum(
        1
        for op in capture.ops
        if op.phase == "forward"
        and op.is_inplace
        and op.name.startswith("aten.index_put_")
    )
    detail = (
        "no clone-then-scatter and no user-level copy over 64 MiB in the forward pass"
    )
    if scatters:
        detail += f"; {scatters} in-place scatters write into fresh tensors"
    return AlreadyRight("COPY001", "no needless copies", detail)


@rule(
    CODE, NAME, severity="medium", fix_safety=EXACT, levers=("inplace-scatter",),
    already_right=(already_right,),
)
def check(capture: Capture, config: RuleConfig) -> Iterator[Finding]:
    ops = capture.ops
    inside = call_op_indices(capture, ("sdpa", "loss", "norm"))
    hits: list[tuple[OpRecord, OpRecord | None]] = []
    for op in ops:
        if (
            op.phase != "forward"
            or op.recompute
            or op.index in inside
            or base_name(op.name) not in COPIES
        ):
            continue
        if base_name(op.name) == "clone" and is_reshape_copy(ops, op):
            continue
        target = None
        if base_name(op.name) == "clone" and op.outputs:
            target = clone_scatter_target(ops, op)
            if target is not None and not made_in_step(ops, op):
                target = None
        if target is not None or op.write_bytes >= LARGE_COPY_BYTES:
            hits.append((op, target))
    # no clone-then-scatter and no large user-level copy
    if not hits:
        return
    backward = pattern_view(capture).backward
    for group in group_by_source(hits, lambda h: h[0].source).values():
        yield _finding(group, backward)


def _finding(group: list[tuple[OpRecord, OpRecord | None]], backward) -> Finding:
    op, target = group[0]
    count = len(group)
    copied = sum(o.write_bytes for o, _ in group)
    kind = base_name(op.name)
    if target is not None:
        message = (
            f"A {kind} of {meta_text(op.outputs[0])} ({fmt_bytes(op.write_bytes)}), {count}x per "
            f"step, whose only use is the in-place {base_name(target.name)} at line "
            f"{target.source.line if target.source else '?'}: the cloned tensor is made earlier in "
            "the step, so the scatter can write into it directly."
        )
        fix = "Scatter in place into the original tensor instead of cloning it first"
        lever = "inplace-scatter"
    else:
        message = (
            f"A {kind} writing {meta_text(op.outputs[0])} ({fmt_bytes(op.write_bytes)}), {count}x "
            f"per step: {fmt_bytes(copied)} copied per step in the forward pass."
        )
        fix = (
            "Avoid materialising the concatenation (process the parts separately or write into a "
            "preallocated buffer)"
            if kind == "cat"
            else "Drop the copy where the consumer accepts the original (or a strided view)"
        )
        lever = None
    return registered(CODE).finding(
        message=message,
        fix_title=fix,
        receipts=(
            receipt(
                op.source,
                module=module_pattern(o.module for o, _ in group),
                op=op.name + (f" -> {target.name}" if target is not None else ""),
                shapes=meta_text(op.outputs[0]),
                count=count,
            ),
        ),
        severity="medium" if copied >= LARGE_COPY_BYTES else "low",
        effort="S",
        risk="low",
        lever=lever,
        work=Work(
            fixed=(),
            now_ops=with_backward([o.index for o, _ in group], backward),
            calls_per_step=count,
            saved_bytes=copied,
        ),
        details={
            "copied_bytes": copied,
            "scatter": target.name if target is not None else None,
        },
    )
