"""LOSS001 loss-over-ignored-rows: a cross-entropy computed over rows whose target is ignored.

## What it does
Finds `cross_entropy`/`nll_loss` calls where a share of the targets equals `ignore_index`
(padding), and reports that fraction with the FLOPs and bytes spent on those rows per step: the
loss itself and the ops that built its input (the LM head matmul, concatenations, casts), forward
and backward.

## Why is this bad?
Ignored rows contribute nothing to the loss, yet the head projects them onto the whole
vocabulary, the logits are copied and upcast for them, and backward runs through all of it. With
batch-max padding this is often 40-60% of the rows, and the largest tensors of the step.

## Example
```python
logits = lm_head(hidden).reshape(-1, vocab).float()
loss = F.cross_entropy(logits, targets.reshape(-1), ignore_index=-100)
```

Use instead:
```python
rows = layout.target_rows  # indices of the real targets, built on the host
logits = lm_head(hidden.reshape(-1, width).index_select(0, rows)).float()
loss = F.cross_entropy(logits, targets.reshape(-1).index_select(0, rows))
```

## Fix
Select the rows with a real target before the head (lever `loss-valid-rows`); build the row indices on the host so the selection does not sync. For a Hugging Face masked LM the lever
does this (the output projection gets the masked tokens only); for a Hugging Face causal LM it
selects the rows before the loss, and lever `fused-linear-cross-entropy` computes the head and
the loss in chunks, without the full logits.

## Fix safety
Changes numerics only in summation order (the ignored rows contribute zero either way); re-pin
loss oracles that compare bitwise.

## Known problems
The ops that build the loss input are found by walking back from the loss over ops whose output
has the class dimension last; a head far from the loss (more than 32 ops) is not counted. The
fraction is this step's; it moves with the batch.

## References
- https://pytorch.org/docs/stable/generated/torch.nn.functional.cross_entropy.html
"""

from __future__ import annotations

from collections.abc import Iterator

from levers.capture.records import CallRecord, Capture, OpRecord
from levers.audit.config import RuleConfig
from levers.audit.finding import AlreadyRight, Finding, Work
from levers.audit.pattern_view import pattern_view
from levers.audit.patterns import (
    base_name,
    fmt_bytes,
    meta_text,
    module_pattern,
    receipt,
    sum_bytes,
    sum_flops,
    with_backward,
)
from levers.audit.rules.registry import registered, rule
from levers.vocab import CHANGES_NUMERICS

CODE, NAME = "LOSS001", "loss-over-ignored-rows"
MIN_IGNORED_FRACTION = 0.05
PRODUCER_WINDOW = 32
MAX_GAP = (
    4  # non-matching ops tolerated between producers (reshape copies of the head input)
)


def input_producers(capture: Capture, call: CallRecord) -> list[OpRecord]:
    """Forward ops before the loss that wrote its [.., V] input: head matmuls, cats, casts."""
    classes = call.args["input"]["shape"][-1]
    found: list[OpRecord] = []
    gap = 0
    for op in reversed(
        capture.ops[max(0, call.first_op - PRODUCER_WINDOW) : call.first_op]
    ):
        if op.phase != "forward":
            break
        matches = (
            bool(op.outputs)
            and op.outputs[0].shape[-1:] == (classes,)
            and op.outputs[0].dtype.startswith(("float", "bfloat"))
        )
        if matches:
            found.append(op)
            gap = 0
        elif not op.is_view:
            gap += 1
            if gap > MAX_GAP:
                break
    return sorted(found, key=lambda op: op.index)


_MATMULS = ("mm", "addmm", "matmul", "linear", "bmm")


def _valid_rows_bench(call: CallRecord, producers: list[OpRecord]) -> dict:
    """The fix to microbenchmark on a GPU: the head matmul (if one wrote the loss input), the cast
    and the loss, over the rows with a real target only."""
    args = call.args
    head = next((op for op in producers if base_name(op.name) in _MATMULS), None)
    spec = {
        "kind": "loss_rows",
        "rows": args["num_targets"] - args["num_ignored"],
        "vocab": args["input"]["shape"][-1],
        "loss_dtype": args["input"]["dtype"],
        "input_dtype": args["input"]["dtype"],
        "head": None,
    }
    if head is not None:
        # the activation operand: the one whose last dimension is the hidden size
        activation = head.inputs[-2]
        spec["head"] = {"hidden": activation.shape[-1], "dtype": activation.dtype}
    return spec


def already_right(capture: Capture, config: RuleConfig) -> AlreadyRight | None:
    """Losses whose rows all count."""
    losses = [
        c for c in capture.calls if c.kind == "loss" and "ignored_fraction" in c.args
    ]
    if not losses or any(
        c.args["ignored_fraction"] >= MIN_IGNORED_FRACTION for c in losses
    ):
        return None
    rows = sum(int(c.args.get("num_targets", 0)) for c in losses)
    return AlreadyRight(
        "LOSS001",
        "loss over valid rows only",
        f"{len(losses)} loss calls over {rows} rows, none ignored",
    )


@rule(
    CODE, NAME, severity="medium", fix_safety=CHANGES_NUMERICS,
    levers=("loss-valid-rows", "fused-linear-cross-entropy"),
    already_right=(already_right,),
)
def check(capture: Capture, config: RuleConfig) -> Iterator[Finding]:
    backward = pattern_view(capture).backward
    for call in capture.calls:
        # only losses with integer targets and an ignore_index record a fraction
        if (
            call.kind != "loss"
            or "ignored_fraction" not in call.args
            or call.first_op is None
        ):
            continue
        fraction = float(call.args["ignored_fraction"])
        # few or no ignored rows: nothing worth selecting away
        if fraction < MIN_IGNORED_FRACTION:
            continue
        yield _finding(call, fraction, capture, backward)


def _finding(call: CallRecord, fraction: float, capture: Capture, backward) -> Finding:
    ops = capture.ops
    producers = input_producers(capture, call)
    loss_ops = list(range(call.first_op, call.last_op + 1))
    involved = with_backward([op.index for op in producers] + loss_ops, backward)
    involved_ops = [ops[i] for i in involved]
    wasted_flops = int(fraction * sum_flops(involved_ops))
    wasted_bytes = int(fraction * sum_bytes(involved_ops))
    kept_bytes = sum(op.write_bytes for op in producers if not op.is_view)
    kept_bytes += sum(ops[i].write_bytes for i in loss_ops)
    args = call.args
    receipts = [
        receipt(
            call.source,
            module=module_pattern([call.module]),
            op=call.name,
            shapes=f"input {meta_text(args['input'])}, target {meta_text(args.get('target'))}",
        )
    ]
    nearest = next(
        (op for op in reversed(producers) if not op.is_view and op.source is not None),
        None,
    )
    if nearest is not None and nearest.source != call.source:
        receipts.append(
            receipt(
                nearest.source,
                module=module_pattern([nearest.module]),
                op=nearest.name,
                shapes=meta_text(nearest.outputs[0]),
            )
        )
    message = (
        f"{call.name} over {args['num_targets']} rows of which {args['num_ignored']} "
        f"({fraction:.0%}) have target {args.get('ignore_index')}: "
        f"{fmt_bytes(wasted_bytes)} moved and {wasted_flops / 1e9:.3g} GFLOP spent per step on "
        f"ignored rows (the loss and the {len(producers)} ops that built its input, forward and backward)."
    )
    return registered(CODE).finding(
        message=message,
        fix_title="Select the rows with a real target before the LM head (indices built on the host)",
        receipts=tuple(receipts),
        effort="S",
        risk="medium",
        work=Work(
            now_ops=involved,
            calls_per_step=1,
            saved_bytes=int(fraction * kept_bytes),
            fixed_fraction_of_now=1.0 - fraction,
            bench=_valid_rows_bench(call, producers),
        ),
        details={
            "ignored_fraction": fraction,
            "num_targets": args["num_targets"],
            "num_ignored": args["num_ignored"],
            "wasted_flops": wasted_flops,
            "wasted_bytes": wasted_bytes,
        },
    )
