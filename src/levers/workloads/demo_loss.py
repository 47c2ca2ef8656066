"""The suffix loss of the ``demo`` model: cross-entropy over a large vocabulary.

The suffix has two blocks that the base LM head scores separately, answer text then action
tokens, as the original joins "base head + gap + fast block". About half of the target rows are
``IGNORE_INDEX`` padding.

Shapes: B batch, T suffix length, D width, V vocabulary, N real targets.

Lines marked ``# [demo:<flag>]`` hold the inefficiencies listed in :mod:`levers.workloads.demo`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from levers.workloads.demo_data import IGNORE_INDEX, DemoBatch


def suffix_loss_all_rows(
    lm_head: nn.Linear,
    hidden_btd: torch.Tensor,
    batch: DemoBatch,
    *,
    num_text_tokens: int,
    fix_syncs: bool,
) -> torch.Tensor:
    """Mean cross-entropy over the real targets, computed over every row."""
    vocab = lm_head.out_features
    logits_text = lm_head(hidden_btd[:, :num_text_tokens])
    logits_action = lm_head(hidden_btd[:, num_text_tokens:])
    # [demo:loss] The cat copies all logits, then .float() copies them again in fp32, padding too.
    logits = torch.cat([logits_text, logits_action], dim=1).reshape(-1, vocab).float()
    targets = batch.targets_bt.reshape(-1)
    per_token = F.cross_entropy(logits, targets, ignore_index=IGNORE_INDEX, reduction="none")
    if fix_syncs:
        # The real rows are known on the host; gathering them needs no device-to-host copy.
        real_losses = per_token.index_select(0, batch.layout.target_rows)
    else:
        # [demo:syncs] A boolean index has a data-dependent size: nonzero() waits for the GPU.
        real_losses = per_token[targets != IGNORE_INDEX]
    return real_losses.sum() / batch.layout.num_targets


def suffix_loss_real_rows(
    lm_head: nn.Linear, hidden_btd: torch.Tensor, batch: DemoBatch
) -> torch.Tensor:
    """Mean cross-entropy over the real targets, computed on those rows only.

    Each block's real rows are gathered before the LM head, so neither the logits nor their fp32
    copy ever hold a padding row, and no block is concatenated with another.
    """
    layout = batch.layout
    hidden_rows = hidden_btd.reshape(-1, hidden_btd.shape[-1])
    targets = batch.targets_bt.reshape(-1)
    loss_sum = hidden_btd.new_zeros((), dtype=torch.float32)
    for rows in (layout.text_target_rows, layout.action_target_rows):
        logits = lm_head(hidden_rows.index_select(0, rows)).float()
        block_targets = targets.index_select(0, rows)
        loss_sum = loss_sum + F.cross_entropy(logits, block_targets, reduction="sum")
    return loss_sum / layout.num_targets
