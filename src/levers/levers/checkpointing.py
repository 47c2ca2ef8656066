"""The blocks the three activation-checkpointing levers (``ac-full``, ``ac-selective``,
``ac-budget``) wrap, and their wrapping (:func:`levers.block_checkpoint.wrap_blocks`, which
levers memory's checkpointing what-if runs too: the blocks under non-reentrant
``torch.utils.checkpoint``, a Hugging Face model's KV cache off while they are wrapped).
"""

from __future__ import annotations

import torch

from levers.block_checkpoint import ContextFn, Undo, wrap_blocks  # noqa: F401 - re-exported
from levers.blocks import Block, repeated_blocks


def blocks_or_reason(model: torch.nn.Module) -> tuple[list[Block], str | None]:
    """The repeated blocks of ``model``, or why checkpointing has nothing to wrap."""
    blocks = repeated_blocks(model)
    if not blocks:
        return [], (
            "the model has no repeated blocks (an nn.ModuleList or nn.Sequential of at least two "
            "modules of one class) to checkpoint"
        )
    wrapped = [b.path for b in blocks if "forward" in vars(b.module)]
    if wrapped:
        return blocks, (
            f"block {wrapped[0]} already has its own forward (another lever or checkpointing is "
            "applied); undo it first"
        )
    return blocks, None
