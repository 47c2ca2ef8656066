"""The vision tower of the ``demo`` model: a ViT over flattened image patches, and its projector.

Self-attention in the ViT is bidirectional and maskless in effect (every patch is valid), which
is exactly the case the fused attention kernels handle best.

Shapes: B batch, P patches, C values per patch, W width, H heads, E head dim, D text width.

Lines marked ``# [demo:<flag>]`` hold the inefficiencies listed in :mod:`levers.workloads.demo`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from levers.workloads.demo_config import DemoConfig, DemoFixes


def eager_attention(
    q_bhpe: torch.Tensor, k_bhpe: torch.Tensor, v_bhpe: torch.Tensor, valid_bp: torch.Tensor
) -> torch.Tensor:
    """Reference attention: materialised scores, a padding mask, and a float32 softmax."""
    scale = q_bhpe.shape[-1] ** -0.5
    # [demo:vit_attn] Materialises [B, H, P, P] scores (and an fp32 copy) in every block.
    scores_bhpp = torch.einsum("bhqe,bhke->bhqk", q_bhpe * scale, k_bhpe)
    scores_bhpp = scores_bhpp.masked_fill(~valid_bp[:, None, None, :], float("-inf"))
    probs_bhpp = scores_bhpp.float().softmax(dim=-1).to(q_bhpe.dtype)
    return torch.einsum("bhqk,bhke->bhqe", probs_bhpp, v_bhpe)


class VisionAttention(nn.Module):
    def __init__(self, width: int, num_heads: int, *, use_sdpa: bool) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)
        self.use_sdpa = use_sdpa

    def forward(self, x_bpw: torch.Tensor, valid_bp: torch.Tensor) -> torch.Tensor:
        batch, patches, width = x_bpw.shape
        qkv = self.qkv(x_bpw).view(batch, patches, 3, self.num_heads, width // self.num_heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        if self.use_sdpa:
            # Every patch is valid, so no mask is needed and a fused kernel is eligible.
            out = F.scaled_dot_product_attention(q, k, v)
        else:
            out = eager_attention(q, k, v, valid_bp)
        return self.out(out.transpose(1, 2).reshape(batch, patches, width))


class VisionBlock(nn.Module):
    def __init__(self, cfg: DemoConfig, fixes: DemoFixes) -> None:
        super().__init__()
        self.attn_norm = nn.LayerNorm(cfg.vit_width, eps=cfg.norm_eps)
        self.attn = VisionAttention(cfg.vit_width, cfg.vit_heads, use_sdpa=fixes.vit_attn)
        self.mlp_norm = nn.LayerNorm(cfg.vit_width, eps=cfg.norm_eps)
        self.fc1 = nn.Linear(cfg.vit_width, cfg.vit_mlp)
        self.fc2 = nn.Linear(cfg.vit_mlp, cfg.vit_width)

    def forward(self, x_bpw: torch.Tensor, valid_bp: torch.Tensor) -> torch.Tensor:
        x_bpw = x_bpw + self.attn(self.attn_norm(x_bpw), valid_bp)
        return x_bpw + self.fc2(F.gelu(self.fc1(self.mlp_norm(x_bpw)), approximate="tanh"))


class VisionTower(nn.Module):
    def __init__(self, cfg: DemoConfig, fixes: DemoFixes) -> None:
        super().__init__()
        self.patch_embed = nn.Linear(cfg.patch_dim, cfg.vit_width)
        self.position_embed = nn.Parameter(0.02 * torch.randn(cfg.num_patches, cfg.vit_width))
        self.blocks = nn.ModuleList(VisionBlock(cfg, fixes) for _ in range(cfg.vit_blocks))
        self.post_norm = nn.LayerNorm(cfg.vit_width, eps=cfg.norm_eps)
        self.checkpoint_blocks = fixes.checkpointing

    def forward(self, patches_bpc: torch.Tensor, valid_bp: torch.Tensor) -> torch.Tensor:
        x_bpw = self.patch_embed(patches_bpc) + self.position_embed
        for block in self.blocks:
            if self.checkpoint_blocks:
                x_bpw = checkpoint(block, x_bpw, valid_bp, use_reentrant=False)
            else:
                # [demo:checkpointing] Every block's activations stay alive until backward.
                x_bpw = block(x_bpw, valid_bp)
        return self.post_norm(x_bpw)


class Projector(nn.Module):
    """Maps ViT features into the text decoder's width."""

    def __init__(self, vit_width: int, text_width: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(vit_width, text_width)
        self.fc2 = nn.Linear(text_width, text_width)

    def forward(self, x_bpw: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x_bpw), approximate="tanh"))
