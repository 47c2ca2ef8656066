"""Shapes of the ``demo`` vision-language model and the switches for its eight inefficiencies.

See :mod:`levers.workloads.demo` for what each switch does.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

# The eight planted inefficiencies, in the order of the review that the demo imitates.
FLAGS = (
    "suffix_attn",
    "vit_attn",
    "norm",
    "checkpointing",
    "loss",
    "syncs",
    "clone",
    "peak_metric",
)


@dataclass(frozen=True)
class DemoFixes:
    """Which inefficiencies are fixed (True) and which are left in (False, the default)."""

    suffix_attn: bool = False
    vit_attn: bool = False
    norm: bool = False
    checkpointing: bool = False
    loss: bool = False
    syncs: bool = False
    clone: bool = False
    peak_metric: bool = False

    def names(self) -> tuple[str, ...]:
        """The fixed flags, in :data:`FLAGS` order."""
        return tuple(flag for flag in FLAGS if getattr(self, flag))


def parse_fixed(value: Any) -> DemoFixes:
    """Resolve ``fixed``: "none", "all", "a,b" or a list/tuple of flag names."""
    if isinstance(value, str):
        if value.strip() == "none":
            return DemoFixes()
        if value.strip() == "all":
            return DemoFixes(**{flag: True for flag in FLAGS})
        names = [name.strip() for name in value.split(",") if name.strip()]
    elif isinstance(value, (list, tuple, set, frozenset)):
        names = list(value)
    else:
        raise ValueError(
            f"fixed={value!r} is not supported; use 'none', 'all', or a comma-separated list of: "
            + ", ".join(FLAGS)
        )
    unknown = [name for name in names if name not in FLAGS]
    if unknown:
        raise ValueError(
            f"fixed names unknown flag(s) {', '.join(map(repr, unknown))}; valid flags are: "
            + ", ".join(FLAGS)
            + " (or 'none' / 'all')"
        )
    return DemoFixes(**{name: True for name in names})


@dataclass(frozen=True)
class DemoConfig:
    """Model and batch shapes of one ``demo`` size."""

    batch_size: int
    # vision tower
    num_patches: int
    patch_dim: int
    vit_width: int
    vit_blocks: int
    vit_heads: int
    vit_mlp: int
    # text decoder
    text_width: int
    text_layers: int
    text_heads: int
    text_kv_heads: int
    head_dim: int
    text_ffn: int
    # The last `extension_vocab` ids of `vocab_size` are action tokens with their own embedding
    # table (the "dual-lookup" embedding); the LM head covers the whole vocabulary.
    vocab_size: int
    extension_vocab: int
    # sequence: prefix = image tokens + text tokens; suffix = answer text + action tokens
    prefix_text_tokens: int
    suffix_text_tokens: int
    suffix_action_tokens: int
    rope_theta: float = 1_000_000.0
    norm_eps: float = 1e-6

    @property
    def prefix_len(self) -> int:
        return self.num_patches + self.prefix_text_tokens

    @property
    def suffix_len(self) -> int:
        return self.suffix_text_tokens + self.suffix_action_tokens

    @property
    def base_vocab(self) -> int:
        return self.vocab_size - self.extension_vocab

    def with_batch_size(self, batch_size: int) -> DemoConfig:
        return dataclasses.replace(self, batch_size=batch_size)


SIZES = {
    # Runs a step in a few tens of milliseconds on a 2-core CPU.
    "tiny": DemoConfig(
        batch_size=2,
        num_patches=16,
        patch_dim=48,
        vit_width=64,
        vit_blocks=2,
        vit_heads=4,
        vit_mlp=128,
        text_width=64,
        text_layers=2,
        text_heads=4,
        text_kv_heads=2,
        head_dim=16,
        text_ffn=128,
        vocab_size=512,
        extension_vocab=64,
        prefix_text_tokens=16,
        suffix_text_tokens=2,
        suffix_action_tokens=6,
    ),
    # About 1.1e9 parameters for one H200: a SigLIP-shaped ViT (27x27 patches of 14x14x3,
    # width 1152, head_dim 72) and a 2048-wide GQA text decoder with a 152k vocabulary; the
    # prefix is 729 image + 371 text = 1100 tokens and the suffix 60, as in the review.
    "1b": DemoConfig(
        batch_size=8,
        num_patches=729,
        patch_dim=588,
        vit_width=1152,
        vit_blocks=8,
        vit_heads=16,
        vit_mlp=4304,
        text_width=2048,
        text_layers=8,
        text_heads=16,
        text_kv_heads=4,
        head_dim=128,
        text_ffn=5632,
        vocab_size=151936,
        extension_vocab=1024,
        prefix_text_tokens=371,
        suffix_text_tokens=12,
        suffix_action_tokens=48,
    ),
}
