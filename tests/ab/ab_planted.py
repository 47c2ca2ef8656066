"""A tiny causal language model and levers planted in it: wrong ones and correct ones.

``lever`` picks the candidate's change:

wrong (each changes the math by far more than rounding):

- "no_residual": the attention block's residual connection is dropped;
- "scaled_loss": the loss is multiplied by 1.5;
- "stale_weight": the optimizer is built without the MLP's first weight, which never updates;
- "no_causal_mask": attention sees the future tokens.

correct (each equal to the reference in real arithmetic; only rounding may differ):

- "reordered": the attention scores scaled before the product instead of after, and the MLP's
  first matmul split in two halves over its output and concatenated;
- "fused_optimizer": AdamW with ``fused=True`` instead of the single-tensor loop;
- "autocast": the whole step under bf16 autocast (against an fp32 baseline: rounding only).

``autocast=True`` runs the baseline's own step under bf16 autocast too.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from levers import Workload

WRONG = ("no_residual", "scaled_loss", "stale_weight", "no_causal_mask")
CORRECT = ("reordered", "fused_optimizer", "autocast")
VOCAB, DIM, SEQ, BATCH, HEADS = 32, 16, 8, 4, 2


class TinyLM(torch.nn.Module):
    def __init__(self, lever: str) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, DIM)
        self.qkv = torch.nn.Linear(DIM, 3 * DIM)
        self.proj = torch.nn.Linear(DIM, DIM)
        self.up = torch.nn.Linear(DIM, 4 * DIM)
        self.down = torch.nn.Linear(4 * DIM, DIM)
        self.head = torch.nn.Linear(DIM, VOCAB)
        self.lever = lever

    def _attention(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, HEADS, DIM // HEADS).permute(2, 0, 3, 1, 4)
        scale = 1.0 / math.sqrt(DIM // HEADS)
        if self.lever == "reordered":
            scores = (q * scale) @ k.transpose(-1, -2)
        else:
            scores = (q @ k.transpose(-1, -2)) * scale
        if self.lever != "no_causal_mask":
            future = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
            scores = scores.masked_fill(future, float("-inf"))
        out = scores.softmax(-1) @ v
        return self.proj(out.transpose(1, 2).reshape(b, t, DIM))

    def _up(self, x: torch.Tensor) -> torch.Tensor:
        if self.lever == "reordered":
            w_a, w_b = self.up.weight.chunk(2, dim=0)
            b_a, b_b = self.up.bias.chunk(2)
            return torch.cat([F.linear(x, w_a, b_a), F.linear(x, w_b, b_b)], dim=-1)
        return self.up(x)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        a = self._attention(x)
        x = a if self.lever == "no_residual" else x + a
        x = x + self.down(F.gelu(self._up(x)))
        return self.head(x)


def build(
    seed: int = 0,
    lever: str = "none",
    autocast: bool = False,
    lr: float = 0.05,
    device: str = "cpu",
):
    if lever not in ("none", *WRONG, *CORRECT):
        raise ValueError(f"unknown lever {lever!r}")
    torch.manual_seed(seed)
    model = TinyLM(lever).to(device)
    params = [p for name, p in model.named_parameters() if name != "up.weight"]
    optimizer = torch.optim.AdamW(
        params if lever == "stale_weight" else model.parameters(),
        lr=lr,
        foreach=False,
        fused=True if lever == "fused_optimizer" else None,
    )
    generator = torch.Generator().manual_seed(seed + 1)
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=generator).to(device)
    device_type = torch.device(device).type
    in_autocast = autocast or lever == "autocast"

    def step():
        with torch.autocast(device_type, dtype=torch.bfloat16, enabled=in_autocast):
            logits = model(tokens[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, VOCAB).float(), tokens[:, 1:].reshape(-1))
        if lever == "scaled_loss":
            loss = loss * 1.5
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    return Workload(model=model, step=step, optimizer=optimizer, tokens_per_step=BATCH * SEQ)
