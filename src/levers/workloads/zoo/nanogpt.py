"""The zoo's hand-written model: a nanoGPT-style decoder (the shape of Karpathy's nanoGPT).

Written as such models usually are, without a framework: a token and a learned position
embedding, blocks of pre-LayerNorm causal self-attention (one fused qkv linear,
``F.scaled_dot_product_attention(is_causal=True)``) and a GELU MLP, a final LayerNorm and a head
tied to the token embedding. ``full`` is GPT-2 small (12 x 768, vocabulary padded to 50304) at
batch 8 x 1024.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from levers.workloads.zoo.spec import Shape, ZooModel, token_ids


class CausalSelfAttention(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(self, x_btc: torch.Tensor) -> torch.Tensor:
        b, t, c = x_btc.shape
        qkv = self.qkv(x_btc).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        q_bhtd, k_bhtd, v_bhtd = qkv.unbind(0)
        y_bhtd = F.scaled_dot_product_attention(q_bhtd, k_bhtd, v_bhtd, is_causal=True)
        return self.proj(y_bhtd.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(width)
        self.attn = CausalSelfAttention(width, heads)
        self.ln_2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(approximate="tanh"), nn.Linear(4 * width, width)
        )

    def forward(self, x_btc: torch.Tensor) -> torch.Tensor:
        x_btc = x_btc + self.attn(self.ln_1(x_btc))
        return x_btc + self.mlp(self.ln_2(x_btc))


class GPT(nn.Module):
    def __init__(self, vocab_size: int, block_size: int, width: int, layers: int, heads: int):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, width)
        self.wpe = nn.Embedding(block_size, width)
        self.h = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied, as in GPT-2
        # GPT-2's initialisation: torch's defaults (N(0, 1) embeddings) start the tied head at
        # logits of tens
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    def forward(self, idx_bt: torch.Tensor, targets_bt: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx_bt.shape[1], device=idx_bt.device)
        x_btc = self.wte(idx_bt) + self.wpe(positions)
        for block in self.h:
            x_btc = block(x_btc)
        logits_btv = self.lm_head(self.ln_f(x_btc))
        return F.cross_entropy(logits_btv.flatten(0, 1).float(), targets_bt.flatten())


def _model(shape: Shape) -> nn.Module:
    return GPT(shape["vocab_size"], shape["seq_len"], shape["width"], shape["layers"],
               shape["heads"])


def _batch(shape: Shape, generator: torch.Generator) -> dict[str, torch.Tensor]:
    # one more token than the context: inputs are [:-1], targets the next token [1:]
    ids = token_ids({**shape, "seq_len": shape["seq_len"] + 1}, generator)
    return {"idx_bt": ids[:, :-1], "targets_bt": ids[:, 1:]}


MODEL = ZooModel(
    name="nanogpt",
    family="decoder",
    library="levers",
    sizes={
        "tiny": {"width": 64, "layers": 2, "heads": 4, "vocab_size": 512, "seq_len": 32,
                 "batch_size": 2},
        "full": {"width": 768, "layers": 12, "heads": 12, "vocab_size": 50304, "seq_len": 1024,
                 "batch_size": 8},
    },
    make_model=_model,
    make_batch=_batch,
    loss=lambda model, inputs: model(**inputs),
    tokens_per_step=lambda shape: shape["batch_size"] * shape["seq_len"],
)
