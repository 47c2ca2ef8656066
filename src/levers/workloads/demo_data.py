"""Synthetic batches for the ``demo`` model.

The prefix of every sample is ``num_patches`` image placeholder tokens followed by text tokens.
The suffix is answer text then action tokens (ids from the extension vocabulary), teacher-forced:
the inputs are the targets shifted right by one. Each sample's suffix is cut to its own length,
and the rest of its targets are ``IGNORE_INDEX`` padding (about half of all rows), as batch-max
padding leaves them.

What does not change from step to step (where the image tokens are, which target rows are real)
is laid out once on the host, so the step never has to ask the GPU for it.

Shapes: B batch, P patches, C values per patch, S prefix length, T suffix length, N real targets.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from levers.workloads.demo_config import DemoConfig

IGNORE_INDEX = -100
BOS_ID = 1
IMAGE_TOKEN_ID = 2
FIRST_TEXT_ID = 3


@dataclass(frozen=True)
class DemoLayout:
    """The parts of every batch that are fixed for the run, built on the host once.

    Row indices count over the flattened suffix, ``b * T + t``.
    """

    image_rows: torch.Tensor  # [B * P] sample of each image token
    image_cols: torch.Tensor  # [B * P] prefix position of each image token
    num_image_tokens: int
    is_padding_bt: torch.Tensor  # [B, T] True where the target is IGNORE_INDEX
    target_rows: torch.Tensor  # [N] rows with a real target
    text_target_rows: torch.Tensor  # the rows of target_rows in the answer-text block
    action_target_rows: torch.Tensor  # the rows of target_rows in the action block
    num_targets: int


@dataclass(frozen=True)
class DemoBatch:
    patches_bpc: torch.Tensor
    patch_valid_bp: torch.Tensor
    prefix_ids_bs: torch.Tensor
    suffix_ids_bt: torch.Tensor
    targets_bt: torch.Tensor
    layout: DemoLayout


# the layout is built in plain Python on the host, fake tensors or not: about 4 list entries per
# token (28 bytes each, and as many again in the tensors made from them). Past this many tokens
# per step it would take gigabytes of host memory and minutes before the step runs
MAX_LAYOUT_TOKENS = 1 << 25


def check_layout_size(cfg: DemoConfig) -> None:
    """Refuse a batch whose host-side layout would not fit a laptop, before building it."""
    tokens = cfg.batch_size * (cfg.suffix_len + cfg.num_patches)
    if tokens > MAX_LAYOUT_TOKENS:
        largest = MAX_LAYOUT_TOKENS // (cfg.suffix_len + cfg.num_patches)
        raise ValueError(
            f"demo: batch_size={cfg.batch_size} is {tokens:,} tokens per step, and the demo "
            f"builds each step's layout in Python on the host (about {tokens * 4 * 56 / 2**30:.0f} "
            f"GiB, even under levers memory's fake tensors); use batch_size <= {largest:,}"
        )


def make_layout(cfg: DemoConfig, seed: int, device: torch.device) -> DemoLayout:
    """Place the image tokens and give each sample a suffix length from 30% to 70% of T.

    The lengths are spread evenly, so about half of all target rows are padding at any batch
    size, and shuffled over the samples by ``seed``. Everything is worked out in plain Python,
    so a layout can be made under a fake-tensor mode too.
    """
    batch, suffix_len = cfg.batch_size, cfg.suffix_len
    check_layout_size(cfg)
    shortest, longest = 0.3 * suffix_len, 0.7 * suffix_len
    step = (longest - shortest) / max(batch - 1, 1)
    lengths = [round(shortest + sample * step) for sample in range(batch)]
    random.Random(seed).shuffle(lengths)

    real_rows = [b * suffix_len + t for b in range(batch) for t in range(lengths[b])]
    text_rows = [row for row in real_rows if row % suffix_len < cfg.suffix_text_tokens]
    action_rows = [row for row in real_rows if row % suffix_len >= cfg.suffix_text_tokens]

    def index(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=device)

    return DemoLayout(
        image_rows=index([b for b in range(batch) for _ in range(cfg.num_patches)]),
        image_cols=index([p for _ in range(batch) for p in range(cfg.num_patches)]),
        num_image_tokens=batch * cfg.num_patches,
        is_padding_bt=torch.tensor(
            [[t >= lengths[b] for t in range(suffix_len)] for b in range(batch)], device=device
        ),
        target_rows=index(real_rows),
        text_target_rows=index(text_rows),
        action_target_rows=index(action_rows),
        num_targets=len(real_rows),
    )


def sample_batch(
    cfg: DemoConfig, layout: DemoLayout, generator: torch.Generator, dtype: torch.dtype
) -> DemoBatch:
    """Draw one batch on the generator's device."""
    device = generator.device
    batch = cfg.batch_size

    def token_ids(low: int, high: int, length: int) -> torch.Tensor:
        return torch.randint(low, high, (batch, length), generator=generator, device=device)

    patches_bpc = torch.randn(
        batch, cfg.num_patches, cfg.patch_dim, generator=generator, device=device, dtype=dtype
    )
    image_tokens = torch.full((batch, cfg.num_patches), IMAGE_TOKEN_ID, device=device)
    prefix_ids_bs = torch.cat(
        [image_tokens, token_ids(FIRST_TEXT_ID, cfg.base_vocab, cfg.prefix_text_tokens)], dim=1
    )
    answer = token_ids(FIRST_TEXT_ID, cfg.base_vocab, cfg.suffix_text_tokens)
    actions = token_ids(cfg.base_vocab, cfg.vocab_size, cfg.suffix_action_tokens)
    tokens_bt = torch.cat([answer, actions], dim=1)
    bos = torch.full((batch, 1), BOS_ID, device=device)
    return DemoBatch(
        patches_bpc=patches_bpc,
        patch_valid_bp=torch.ones(batch, cfg.num_patches, dtype=torch.bool, device=device),
        prefix_ids_bs=prefix_ids_bs,
        suffix_ids_bt=torch.cat([bos, tokens_bt[:, :-1]], dim=1),
        targets_bt=tokens_bt.masked_fill(layout.is_padding_bt, IGNORE_INDEX),
        layout=layout,
    )
