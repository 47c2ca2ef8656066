"""Rotary position embeddings (rotate-half form), shared by the built-in decoders.

Legend: T positions, E head dim, B batch, H heads.
"""

from __future__ import annotations

import torch


def rope_table(
    num_positions: int, head_dim: int, theta: float, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin, each [T, E] in float32, for rotate-half RoPE."""
    exponents = torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim
    positions = torch.arange(num_positions, device=device, dtype=torch.float32)
    angles = torch.outer(positions, theta**-exponents)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def apply_rope(x_bhte: torch.Tensor, cos_te: torch.Tensor, sin_te: torch.Tensor) -> torch.Tensor:
    half = x_bhte.shape[-1] // 2
    rotated = torch.cat([-x_bhte[..., half:], x_bhte[..., :half]], dim=-1)
    return x_bhte * cos_te.to(x_bhte.dtype) + rotated * sin_te.to(x_bhte.dtype)
