"""PAD001 padding-tokens: a share of every step's tokens is padding that the whole model computes on.

## What it does
Reads the loss calls' targets: the targets equal to `ignore_index` in the runs that begin or
end each row, less the one target per sequence that a causal shift ignores (a language model
predicts no token after the last), are the step's padding. Ignored targets inside the rows are
not padding: a masked LM ignores every token it did not mask (~85% of them), and its rows also
begin and end in short runs of those by chance, which are discounted (counted as padding only
beyond three standard deviations of what chance leaves there). Where the rows cannot be read
(a flat target that views no [batch, length] tensor), every ignored target but the causal
shift is taken for padding. It states the time the step spends on them:
that share of the step's time that grows with the tokens (everything but the optimizer and the
launch gaps, from the bottleneck section), as an upper bound. It fires when padding is at least
1% of the tokens, and says plainly when removing it is not worth the change (under 5% of the
step).

## Why is this bad?
Padded positions run through every matmul, norm and attention of the model, and their loss is
thrown away. Batch-max padding of variable-length data often wastes a third of the step or
more; a few percent is not worth a new collator.

## Example
```python
batch = tokenizer(texts, padding="longest", return_tensors="pt")  # pad to the batch's longest
```

Use instead:
```python
# pack sequences back to back (padding-free), with per-document attention
collator = DataCollatorWithFlattening()
```

## Fix
Pack the sequences into fewer rows with attention kept inside each (lever `packing`), or flatten
the batch into one row without padding, as `DataCollatorWithFlattening` does (lever
`padding-free`); both restart the position ids per sequence, and transformers keeps each
sequence's attention to itself. Where the padding stays, round its width up to a multiple of 64
so that compiled code does not re-trace for every length (lever `pad-to-multiple`). Length
bucketing is not implemented yet.

## Fix safety
Changes numerics within rounding only: the same tokens predict the same targets from the same
context, summed in another order and through matmuls of other shapes; each lever's test checks
the loss per real token and the gradients against the padded step (fp32). Packing is exact only
with per-document attention: the levers refuse a model whose attention would cross documents.

## Known problems
Only targets are read: padding whose target is a real token (no ignore_index), or prompt tokens
masked out of the loss on purpose, are counted the same way; the rule cannot tell masked prompts
from padding. The attention's cost grows with the square of the length, so the time on padding
is first-order.

## References
- https://huggingface.co/blog/packing-with-FA2
- Krell et al., Efficient Sequence Packing without Cross-contamination (2021), https://arxiv.org/abs/2107.02027
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from levers.capture.records import Capture
from levers.audit.bottleneck import OPTIMIZER, step_bottleneck
from levers.audit.config import RuleConfig
from levers.audit.finding import Finding, Work
from levers.audit.patterns import receipt
from levers.audit.rules.registry import registered, rule
from levers.vocab import CHANGES_NUMERICS

CODE, NAME = "PAD001", "padding-tokens"
MIN_PADDING_SHARE = 0.01
WORTH_IT_STEP_SHARE = 0.05
WIDTH_MULTIPLE = 64
LEVERS = ("packing", "padding-free", "pad-to-multiple")


def _sequences(capture: Capture) -> tuple[int, int] | None:
    """(batch, length) of the step's sequences, from the first SDPA query [B, H, T, E]."""
    for call in capture.calls:
        query = call.args.get("query") if call.kind == "sdpa" else None
        if query and len(query["shape"]) == 4:
            return query["shape"][0], query["shape"][2]
    return None


# padding is counted where the ignored targets at the rows' ends exceed what chance leaves there
# by this many standard deviations (a masked LM's unmasked tokens also end rows now and then)
CHANCE_SDS = 3.0
# a loss that ignores this share of the targets inside its rows or more is a masked LM's
MASKED_SHARE = 0.5


def _padding(args: dict, seqs: tuple[int, int] | None) -> tuple[int, int, int]:
    """(padding targets, causal-shift targets, ignored targets that are neither) of a loss call.

    With the rows known (the recorder's ``edge_ignored``...), padding is the runs of ignored
    targets that begin or end a row, less the causal shift (one per row, where every row ends
    in an ignored target and most targets inside the rows are real) and less what the ignored
    targets inside the rows leave at the ends by chance: a masked LM ignores ~85% of its
    targets, scattered, so its rows begin and end in runs of ~q/(1-q) ignored targets (q: the
    share ignored inside the rows) that are not padding; they count only past ``CHANCE_SDS``
    standard deviations of that chance. Without the rows, every ignored target but the causal
    shift is taken for padding."""
    ignored = args["num_ignored"]
    if "edge_ignored" not in args:
        shifted = 0
        if seqs is not None and seqs[0] * seqs[1] == args["num_targets"] and ignored >= seqs[0]:
            shifted = seqs[0]  # one ignored target per sequence: the causal shift, not padding
        return ignored - shifted, shifted, 0
    rows, edge = args["num_rows"], args["edge_ignored"]
    inner = args["inner_targets"]
    share = args["inner_ignored"] / inner if inner else 0.0
    # a causal LM's targets: every row ends in an ignored one (a masked LM ignores most of its
    # targets, and has no shift)
    causal = share < MASKED_SHARE and args["rows_ending_ignored"] == rows and edge >= rows
    shifted = rows if causal else 0
    if share >= 1.0:
        return 0, shifted, ignored - shifted
    chance = 2 * rows * share / (1.0 - share)  # runs of a geometric length at both ends
    spread = math.sqrt(2 * rows * share) / (1.0 - share)
    beyond = edge - shifted - chance
    padded = round(beyond) if beyond > CHANCE_SDS * spread else 0
    return padded, shifted, ignored - shifted - padded


@rule(CODE, NAME, severity="medium", fix_safety=CHANGES_NUMERICS, levers=LEVERS)
def check(capture: Capture, config: RuleConfig) -> Iterator[Finding]:
    losses = [c for c in capture.calls if c.kind == "loss" and c.args.get("num_targets")]
    # no loss with integer targets to read padding from
    if not losses:
        return
    call = max(losses, key=lambda c: c.args["num_targets"])
    targets, ignored = call.args["num_targets"], call.args["num_ignored"]
    seqs = _sequences(capture)
    padded, shifted, inside = _padding(call.args, seqs)
    padding = padded / targets
    # (almost) no padding
    if padding < MIN_PADDING_SHARE:
        return
    b = step_bottleneck(capture, config)
    per_token_ms = b.step_ms - b.fixed_ms
    on_padding_ms = padding * per_token_ms
    step_share = on_padding_ms / b.step_ms if b.step_ms > 0 else 0.0
    worth_it = step_share >= WORTH_IT_STEP_SHARE
    message = (
        f"{padding:.1%} of the step's {targets:,} tokens are padding ({padded:,} targets "
        f"equal to ignore_index={call.args.get('ignore_index')}"
        + (" at the ends of the rows" if "edge_ignored" in call.args else "")
        + (f", less {shifted} for the causal shift" if shifted else "")
        + (f"; {inside:,} more ignored inside the rows, as a masked LM's unmasked tokens are, "
           "are not padding" if inside else "")
        + f"); the model computes on them for up to {on_padding_ms:.3g} ms of the "
        f"{b.step_ms:.3g} ms step ({step_share:.1%}, {b.provenance})."
    )
    if not worth_it:
        message += (
            f" Not worth a collator change: at most {step_share:.1%} of the step "
            f"(under {WORTH_IT_STEP_SHARE:.0%})."
        )
    if seqs is not None and seqs[1] % WIDTH_MULTIPLE:
        message += (
            f" The sequence length {seqs[1]} is not a multiple of {WIDTH_MULTIPLE}: round the "
            "padded width up to one (lever pad-to-multiple), so compiled code does not re-trace "
            "for every length."
        )
    optimizer_ms = b.of(OPTIMIZER).time_ms
    variable_ms = b.step_ms - optimizer_ms
    fraction = 1.0 - on_padding_ms / variable_ms if variable_ms > 0 else 1.0
    yield registered(CODE).finding(
        message=message,
        fix_title="Pack the sequences into fewer rows with per-sequence attention, or flatten "
        "them into one row (padding-free)"
        if worth_it
        else "Leave the padding: removing it buys less than the change costs",
        receipts=(
            receipt(
                call.source,
                module=call.module,
                op=call.name,
                shapes=f"{ignored:,} of {targets:,} targets ignored",
            ),
        ),
        severity="medium" if worth_it else "low",
        effort="M",
        risk="low",
        work=Work(
            now_ops=tuple(op.index for op in capture.ops if op.phase != "optimizer"),
            fixed_fraction_of_now=fraction,
        ),
        details={
            "levers": list(LEVERS),
            "padding_share": padding,
            "causal_shift_targets": shifted,
            "time_on_padding_ms": on_padding_ms,
            "step_share": step_share,
            "worth_it": worth_it,
            "recommended": worth_it,
        },
    )
