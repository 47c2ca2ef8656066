"""``ac-full``: every repeated block under non-reentrant activation checkpointing.

The same as Hugging Face's ``gradient_checkpointing_enable()`` with ``use_reentrant=False``, for
any model with repeated blocks: each block keeps only its inputs for backward and runs its
forward again there. Activation memory falls to about one block's worth plus the block inputs,
for one extra forward of the blocks (about a third more block compute). Exact: the recompute
runs the same ops on the same inputs (with the RNG state restored), so losses and gradients are
bitwise those without it.
"""

from __future__ import annotations

from levers.levers import register
from levers.levers.checkpointing import blocks_or_reason, wrap_blocks
from levers.levers.lever import Lever, Target, Undo
from levers.vocab import EXACT


def applies(target: Target) -> str | None:
    return blocks_or_reason(target.model)[1]


def patch(target: Target) -> Undo:
    blocks, _ = blocks_or_reason(target.model)
    return wrap_blocks(target.model, blocks)


LEVER = register(
    Lever(
        id="ac-full",
        title="Checkpoint every repeated block (non-reentrant torch.utils.checkpoint)",
        safety=EXACT,
        fixes=("MEM001",),
        applies=applies,
        patch=patch,
    )
)
