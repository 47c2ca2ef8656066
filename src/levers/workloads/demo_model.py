"""The ``demo`` vision-language model: ViT -> projector -> text prefix (KV cache) -> suffix loss.

Shapes: B batch, P patches, S prefix length, T suffix length, D text width.

Lines marked ``# [demo:<flag>]`` hold the inefficiencies listed in :mod:`levers.workloads.demo`.
"""

from __future__ import annotations

import torch
from torch import nn

from levers.workloads.demo_config import DemoConfig, DemoFixes
from levers.workloads.demo_data import IMAGE_TOKEN_ID, DemoBatch
from levers.workloads.demo_loss import suffix_loss_all_rows, suffix_loss_real_rows
from levers.workloads.demo_text import TextDecoder
from levers.workloads.demo_vision import Projector, VisionTower


class DemoVLM(nn.Module):
    """``forward(batch)`` returns the suffix loss.

    ``metrics`` holds what the training step records (``peak_allocated_bytes``).
    """

    def __init__(self, cfg: DemoConfig, fixes: DemoFixes) -> None:
        super().__init__()
        self.cfg = cfg
        self.fixes = fixes
        self.vision = VisionTower(cfg, fixes)
        self.projector = Projector(cfg.vit_width, cfg.text_width)
        self.text = TextDecoder(cfg, fixes)
        self.metrics: dict[str, int] = {}

    def forward(self, batch: DemoBatch) -> torch.Tensor:
        prefix_len = self.cfg.prefix_len
        cos, sin = self.text.rope(batch.prefix_ids_bs.device)
        cache = self.text.prefix(self.embed_prefix(batch), cos[:prefix_len], sin[:prefix_len])
        hidden_btd = self.text.suffix(
            batch.suffix_ids_bt, cache, cos[prefix_len:], sin[prefix_len:]
        )
        if self.fixes.loss:
            return suffix_loss_real_rows(self.text.lm_head, hidden_btd, batch)
        return suffix_loss_all_rows(
            self.text.lm_head,
            hidden_btd,
            batch,
            num_text_tokens=self.cfg.suffix_text_tokens,
            fix_syncs=self.fixes.syncs,
        )

    def embed_prefix(self, batch: DemoBatch) -> torch.Tensor:
        """Token embeddings of the prefix with the projected image features at the image tokens."""
        image_bpd = self.projector(self.vision(batch.patches_bpc, batch.patch_valid_bp))
        embeddings_bsd = self.text.embed(batch.prefix_ids_bs)
        if self.fixes.syncs:
            num_image_tokens = batch.layout.num_image_tokens
        else:
            is_patch = batch.prefix_ids_bs == IMAGE_TOKEN_ID
            # [demo:syncs] int() of a device value waits for the GPU to catch up, every step.
            num_image_tokens = int(is_patch.sum())
        features = image_bpd.flatten(0, 1)[:num_image_tokens].to(embeddings_bsd.dtype)
        if self.fixes.clone:
            # A fresh embedding output that autograd does not need back: safe to write in place.
            prefix_bsd = embeddings_bsd
        else:
            # [demo:clone] A full copy of the prefix embeddings, only to scatter into it.
            prefix_bsd = embeddings_bsd.clone()
        prefix_bsd[batch.layout.image_rows, batch.layout.image_cols] = features
        return prefix_bsd
