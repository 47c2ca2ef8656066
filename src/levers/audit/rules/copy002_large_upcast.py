"""COPY002 large-upcast: large bf16/fp16 tensors copied to fp32, such as logits before a loss.

## What it does
Reports casts from bf16/fp16 to fp32 in the forward pass that write at least 16 MiB in one call,
by source line, with the bytes written per step and, when the fp32 copy feeds a loss, which one.
Casts inside hand-written attention or norm chains are left to ATTN002 and NORM001.

## Why is this bad?
The cast reads the tensor and writes it again at twice the size; the fp32 copy usually stays
alive for backward (a loss keeps its fp32 log-probabilities), and its gradient is cast back. For
full-vocabulary logits this is one of the largest tensors of the step.

## Example
```python
logits = lm_head(hidden).float()
loss = F.cross_entropy(logits, targets, ignore_index=-100)
```

Use instead:
```python
rows = (targets != -100).nonzero_static(size=num_valid).squeeze(-1)  # or host-built indices
logits = lm_head(hidden.index_select(0, rows)).float()
loss = F.cross_entropy(logits, targets.index_select(0, rows))
```

## Fix
Upcast only what needs fp32 (the valid rows, lever `loss-valid-rows`), or let the loss upcast
inside its kernel (`F.cross_entropy` accumulates bf16 inputs in fp32; for a Hugging Face causal
LM, lever `fused-linear-cross-entropy` fuses the head and the loss).

## Fix safety
Changes numerics slightly when the cast moves into the kernel (the log-softmax output is stored
in the input dtype); exact when only the rows that are selected change.

## Known problems
Under autocast, a cast that feeds a loss over rows that all count is not reported: autocast
casts a loss's input to fp32 itself, so the explicit cast costs nothing extra.
On a CPU capture in float32 a `.float()` is a no-op and leaves no op behind, so the upcast is
only visible on a GPU capture (under autocast) or a CPU capture run in bf16
(`--set dtype=bfloat16`).

## References
- https://pytorch.org/docs/stable/amp.html
"""

from __future__ import annotations

from collections.abc import Iterator

from levers.capture.records import CallRecord, Capture, OpRecord
from levers.audit.config import RuleConfig
from levers.audit.finding import Finding, Work
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
from levers.vocab import CHANGES_NUMERICS

CODE, NAME = "COPY002", "large-upcast"
LARGE_UPCAST_BYTES = 16 * 2**20
LOSS_WINDOW = 16  # ops between the cast and the loss that reads it


def is_upcast(op: OpRecord) -> bool:
    return (
        base_name(op.name) in ("_to_copy", "to", "copy_")
        and bool(op.inputs)
        and bool(op.outputs)
        and op.inputs[0].dtype in ("bfloat16", "float16")
        and op.outputs[0].dtype == "float32"
    )


def _consumer_loss(capture: Capture, op: OpRecord) -> CallRecord | None:
    out = op.outputs[0]
    for call in capture.calls:
        if call.kind != "loss" or call.first_op is None:
            continue
        if 0 < call.first_op - op.index <= LOSS_WINDOW:
            inp = call.args.get("input") or {}
            numel = 1
            for d in inp.get("shape", ()):
                numel *= d
            if numel == out.numel and inp.get("dtype") == "float32":
                return call
    return None


@rule(CODE, NAME, severity="medium", fix_safety=CHANGES_NUMERICS, levers=("loss-valid-rows", "fused-linear-cross-entropy"))
def check(capture: Capture, config: RuleConfig) -> Iterator[Finding]:
    view = pattern_view(capture)
    # the ops of attention and norm chains are ATTN002's and NORM001's findings
    taken = call_op_indices(capture, ("sdpa", "norm", "loss"))
    taken.update(i for c in view.eager_attention for i in c.ops)
    taken.update(i for c in view.unfused_norms for i in c.ops)
    casts = [
        op
        for op in capture.ops
        if op.phase == "forward"
        and not op.recompute
        and op.index not in taken
        and is_upcast(op)
        and op.write_bytes >= LARGE_UPCAST_BYTES
    ]
    # no large low-to-full precision copies outside attention and norm chains
    if not casts:
        return
    backward = view.backward
    autocast = bool(capture.settings.get("autocast"))
    for group in group_by_source(casts, lambda op: op.source).values():
        loss = _consumer_loss(capture, group[0])
        # under autocast a loss casts its input to fp32 itself: an explicit upcast of rows that
        # all count adds nothing that autocast would not do
        if loss is not None and autocast and not loss.args.get("ignored_fraction"):
            continue
        yield _finding(group, capture, backward)


def _finding(group: list[OpRecord], capture: Capture, backward) -> Finding:
    op = group[0]
    count = len(group)
    written = sum(o.write_bytes for o in group)
    loss = _consumer_loss(capture, op)
    feeds = ""
    if loss is not None and loss.source is not None:
        feeds = f" It feeds {loss.name} at line {loss.source.line}"
        if loss.args.get("ignored_fraction"):
            feeds += (
                f", where {loss.args['ignored_fraction']:.0%} of the rows are ignored"
            )
        feeds += "."
    return registered(CODE).finding(
        message=(
            f"{meta_text(op.inputs[0])} upcast to float32, {count}x per step: "
            f"{fmt_bytes(written)} of fp32 copies written per step.{feeds}"
        ),
        fix_title=(
            "Select the rows that count before the upcast, or let the loss upcast inside its kernel"
            if loss is not None
            else "Keep the tensor in its low-precision dtype, or upcast only the part that needs fp32"
        ),
        receipts=(
            receipt(
                op.source,
                module=module_pattern(o.module for o in group),
                op=op.name,
                shapes=f"{meta_text(op.inputs[0])} -> {meta_text(op.outputs[0])}",
                count=count,
            ),
        ),
        effort="S",
        risk="medium",
        lever="loss-valid-rows" if loss is not None else None,
        work=Work(
            fixed=(),
            now_ops=with_backward([o.index for o in group], backward),
            calls_per_step=count,
            saved_bytes=written,
        ),
        details={
            "written_bytes": written,
            "feeds_loss": loss.name if loss is not None else None,
        },
    )
