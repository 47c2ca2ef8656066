"""``padding-free``: one row of every sequence back to back, no padding at all.

Each padded batch the step draws (``step.batches``) is replaced by
:func:`levers.batches.flatten`: ``input_ids`` [1, N] with the N real tokens, ``labels`` with -100
at each sequence's first token, ``position_ids`` restarting at 0 for every sequence, and no
``attention_mask``: the batch Hugging Face's ``DataCollatorWithFlattening`` builds (a test holds
them equal). transformers keeps attention inside each sequence from the restarts: through a
document mask (eager, sdpa, flex_attention) or varlen boundaries (flash_attention_2/3, which see
packing in a one-row batch only). :mod:`levers.levers._documents` measures that it does before
the lever applies.

Refuses: a step without batches to change, batches without padding or already packed, a model
that is not a transformers model or whose attention implementation (or measured probe) would
let attention cross documents.

Fix safety: changes numerics within rounding, as packing does: checked against the padded step
in fp32 on a CPU to :data:`TOLERANCE` (relative).
"""

from __future__ import annotations

from typing import Callable

from levers.batches import flatten
from levers.levers import register
from levers.levers._documents import (
    attention_reason,
    batches,
    padding_reason,
    relayout,
)
from levers.levers.lever import Lever, Target
from levers.vocab import CHANGES_NUMERICS

ID = "padding-free"
TOLERANCE = 1e-4


def applies(target: Target) -> str | None:
    reason = padding_reason(batches(target))
    return reason if reason is not None else attention_reason(target.model, rows=1)


def patch(target: Target) -> Callable[[], None]:
    return relayout(target, ID, lambda batch, lengths: flatten(batch, lengths=lengths))


LEVER = register(
    Lever(
        id=ID,
        title="Flatten the batch into one row without padding (DataCollatorWithFlattening's "
        "layout, position ids restart per sequence)",
        safety=CHANGES_NUMERICS,
        tolerance=TOLERANCE,
        fixes=("PAD001",),
        acts_on_batches=True,
        applies=applies,
        patch=patch,
        known_problems="the row's length changes with every batch, so a compiled step re-traces "
        "(mark it dynamic); under sdpa one long row gets a dense [N, N] document mask",
    )
)
