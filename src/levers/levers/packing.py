"""``packing``: lay a step's padded sequences into fewer rows, attention kept inside each one.

Each padded batch the step draws (``step.batches``: :class:`levers.batches.Batches`) is replaced
by :func:`levers.batches.pack`: the same sequences, first-fit-decreasing into rows of ``row_len``
tokens (default the batch's padded width, so no row is longer than a padded one), with
``position_ids`` restarting at every sequence and no ``attention_mask``. transformers reads the
restarts as document boundaries and masks attention to stay inside each sequence (eager, sdpa,
flex_attention; see :mod:`levers.levers._documents`, which also measures that it does before the
lever applies). The labels keep every real target and only those, so the loss per real token is
the padded step's; the model computes on fewer rows.

Options: ``row_len`` (tokens per packed row; at least the longest sequence).

Refuses: a step without batches to change, batches without padding or already packed, a model
that is not a transformers model, an attention implementation that cannot keep packed rows
apart (flash_attention_2/3 only see packing in a one-row batch: use ``padding-free``), and any
model whose measured probe shows attention crossing documents.

Fix safety: changes numerics within rounding: the same (context, target) pairs, summed in
another order and through other matmul shapes; the fp32 CPU test checks the loss and gradients
against the padded step to :data:`TOLERANCE` (relative).
"""

from __future__ import annotations

from typing import Any, Callable

from levers.batches import pack
from levers.levers import register
from levers.levers._documents import (
    attention_reason,
    batches,
    padding_reason,
    relayout,
    token_count_option,
)
from levers.levers.lever import Lever, Target
from levers.vocab import CHANGES_NUMERICS

ID = "packing"
TOLERANCE = 1e-4


def _row_len(options: dict[str, Any]) -> int | None:
    return token_count_option(options, "packing:row_len", None)


def check(options: dict[str, Any]) -> None:
    _row_len(options)


def applies(target: Target) -> str | None:
    found = batches(target)
    reason = padding_reason(found)
    if reason is not None:
        return reason
    row_len = _row_len(target.options)
    if row_len is not None and found.lengths and max(found.lengths) > row_len:
        return (
            f"row_len={row_len} is shorter than its longest sequence ({max(found.lengths)} "
            "tokens), and packing never splits a sequence"
        )
    return attention_reason(target.model, rows=2)


def patch(target: Target) -> Callable[[], None]:
    row_len = _row_len(target.options)
    return relayout(target, ID, lambda batch, lengths: pack(batch, row_len, lengths=lengths))


LEVER = register(
    Lever(
        id=ID,
        title="Pack the sequences into fewer rows, attention kept inside each (position ids "
        "restart per sequence)",
        safety=CHANGES_NUMERICS,
        tolerance=TOLERANCE,
        fixes=("PAD001",),
        acts_on_batches=True,
        applies=applies,
        patch=patch,
        options=("row_len",),
        check=check,
        known_problems="packed rows under sdpa get a dense document mask (the efficient kernel, "
        "not flash); flash_attention_2/3 keep documents apart only in one row (padding-free); "
        "the row count changes with the lengths, so a compiled step may re-trace",
    )
)
