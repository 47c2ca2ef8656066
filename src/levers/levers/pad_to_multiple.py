"""``pad-to-multiple``: round the padded width of every batch up to a multiple (64).

Each padded batch the step draws (``step.batches``) is padded further by
:func:`levers.batches.pad_to_multiple`: width up to the next multiple of ``multiple`` (default
64), the new positions masked out (attention_mask 0, labels -100). A compiled step then sees a
few widths instead of one per batch, and re-traces (or pads inside the kernels) less.

Its case is batches padded each to their own longest (the ``hf`` workload's ``lengths=varied``,
transformers' ``DataCollatorWithPadding``); ``bench/varlen.py --lengths varied`` counts the
widths and the graphs compiled. Under torch.compile's default (automatic dynamic shapes) the
second width already recompiles the blocks to one program for every width (2 graphs for 3
widths, on a CPU with dynamo's eager backend), so the re-traces it saves are those of a static
compile (``--static-widths`` there: 2 graphs against 3).

Options: ``multiple`` (64).

Refuses: a step without batches to change, batches without padding or already packed (nothing
is padded to round), and batches whose width is already a multiple.

Fix safety: changes numerics within rounding: the real tokens, their targets and what they
attend to are the same; the matmuls run at other shapes. Checked against the padded step in
fp32 on a CPU to :data:`TOLERANCE` (relative). It adds padding: on its own it is slower unless
it saves re-traces.
"""

from __future__ import annotations

from typing import Any, Callable

from levers.batches import pad_to_multiple
from levers.levers import register
from levers.levers._documents import (
    add_transform,
    batches,
    padding_reason,
    token_count_option,
)
from levers.levers.lever import Lever, Target
from levers.vocab import CHANGES_NUMERICS

ID = "pad-to-multiple"
DEFAULT_MULTIPLE = 64
TOLERANCE = 1e-4


def _multiple(options: dict[str, Any]) -> int:
    multiple = token_count_option(options, "pad-to-multiple:multiple", DEFAULT_MULTIPLE)
    assert multiple is not None  # it has a default
    return multiple


def check(options: dict[str, Any]) -> None:
    _multiple(options)


def applies(target: Target) -> str | None:
    found = batches(target)
    reason = padding_reason(found)
    if reason is not None:
        return reason
    multiple = _multiple(target.options)
    if found.lengths and max(found.lengths) % multiple == 0:
        return f"its padded width {max(found.lengths)} is already a multiple of {multiple}"
    return None


def patch(target: Target) -> Callable[[], None]:
    multiple = _multiple(target.options)
    return add_transform(batches(target), ID, lambda batch: pad_to_multiple(batch, multiple))


LEVER = register(
    Lever(
        id=ID,
        title="Pad every batch's width up to a multiple of 64, so a compiled step re-traces less",
        safety=CHANGES_NUMERICS,
        tolerance=TOLERANCE,
        fixes=("PAD001",),
        acts_on_batches=True,
        applies=applies,
        patch=patch,
        needs_gpu=True,  # it pays only where compiled GPU code would re-trace per width
        options=("multiple",),
        check=check,
        known_problems="it adds padding: it pays only where widths vary and the step is compiled; "
        "on batches whose width is the same every step it only costs",
    )
)
