"""``llama``: a clean decoder-only language model, the baseline with nothing to fix.

Token embedding, then blocks of (RMSNorm, attention with a fused QKV projection, RoPE and
``F.scaled_dot_product_attention(is_causal=True)`` without a mask, RMSNorm, fused-gate SwiGLU
MLP), a final norm and an untied LM head; cross-entropy over every token (no padding). On a GPU
the step runs under bf16 autocast; AdamW is fused. Nothing in the step copies a device value
to the host. ``eval_losses`` scores a fixed held-out set of random sequences (drawn from the
seed; :func:`levers.workloads._runtime.held_out_losses`), the quality read of ``levers ab``.

Grouped-query attention goes through ``enable_gqa=True``: the flash kernel takes it natively
with a causal mask, so keys and values are never repeated in memory.

Parameters: ``size`` (tiny | 1b | 8b), ``device`` (cpu | cuda), ``dtype`` (parameter dtype,
float32), ``seed`` (0), ``batch_size`` and ``seq_len`` (per size, see :data:`SIZES`).
``8b`` has Llama-3-8B's shapes: build it on a GPU (in float32 the parameters, gradients and
AdamW state alone take ~128 GB, so use ``dtype=bfloat16`` on one H200) or under a fake-tensor
mode, never for real on a CPU.

Shapes: B batch, T sequence, D width, H query heads, K key/value heads, E head dim, V vocabulary.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from levers.workload import Workload
from levers.workloads import _params, _runtime
from levers.workloads._rope import apply_rope, rope_table

LEARNING_RATE = 1e-4


@dataclass(frozen=True)
class LlamaConfig:
    width: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    vocab_size: int
    seq_len: int
    batch_size: int
    rope_theta: float = 500_000.0
    norm_eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.width // self.heads


SIZES = {
    # A step takes a few milliseconds on a 2-core CPU.
    "tiny": LlamaConfig(
        width=64, layers=2, heads=4, kv_heads=2, ffn=128, vocab_size=512, seq_len=64, batch_size=2
    ),
    # About 0.95e9 parameters (TinyLlama-like shapes); 8192 tokens per step.
    "1b": LlamaConfig(
        width=2048,
        layers=16,
        heads=16,
        kv_heads=16,
        ffn=5632,
        vocab_size=32000,
        seq_len=2048,
        batch_size=4,
    ),
    # Llama-3-8B shapes, about 8.0e9 parameters.
    "8b": LlamaConfig(
        width=4096,
        layers=32,
        heads=32,
        kv_heads=8,
        ffn=14336,
        vocab_size=128256,
        seq_len=4096,
        batch_size=1,
    ),
}


class Attention(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.heads, cfg.kv_heads, cfg.head_dim
        kv_width = cfg.kv_heads * cfg.head_dim
        self.qkv = nn.Linear(cfg.width, cfg.width + 2 * kv_width, bias=False)
        self.out = nn.Linear(cfg.width, cfg.width, bias=False)

    def forward(self, x_btd: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        batch, length, width = x_btd.shape
        kv_width = self.num_kv_heads * self.head_dim
        q, k, v = self.qkv(x_btd).split([width, kv_width, kv_width], dim=-1)
        q = q.view(batch, length, self.num_heads, self.head_dim).transpose(1, 2)
        k = k.view(batch, length, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(batch, length, self.num_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, enable_gqa=self.num_kv_heads != self.num_heads
        )
        return self.out(out.transpose(1, 2).reshape(batch, length, width))


class SwiGLU(nn.Module):
    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.gate_up = nn.Linear(width, 2 * hidden, bias=False)
        self.down = nn.Linear(hidden, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.attn_norm = nn.RMSNorm(cfg.width, eps=cfg.norm_eps)
        self.attn = Attention(cfg)
        self.mlp_norm = nn.RMSNorm(cfg.width, eps=cfg.norm_eps)
        self.mlp = SwiGLU(cfg.width, cfg.ffn)

    def forward(self, x_btd: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x_btd = x_btd + self.attn(self.attn_norm(x_btd), cos, sin)
        return x_btd + self.mlp(self.mlp_norm(x_btd))


class LlamaLM(nn.Module):
    """``forward(ids [B, T])`` returns the logits [B, T, V]."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.width)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.norm = nn.RMSNorm(cfg.width, eps=cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.width, cfg.vocab_size, bias=False)

    def forward(self, ids_bt: torch.Tensor) -> torch.Tensor:
        cos, sin = rope_table(
            ids_bt.shape[1], self.cfg.head_dim, self.cfg.rope_theta, ids_bt.device
        )
        x_btd = self.embed(ids_bt)
        for block in self.blocks:
            x_btd = block(x_btd, cos, sin)
        return self.lm_head(self.norm(x_btd))


def build(
    *,
    size: str = "tiny",
    device: Any = "cpu",
    dtype: Any = "float32",
    seed: Any = 0,
    batch_size: Any = None,
    seq_len: Any = None,
) -> Workload:
    """Build the ``llama`` workload; see the module docstring for the parameters."""
    _params.choice("size", size, tuple(SIZES))
    resolved_device = _params.device(device)
    param_dtype = _params.dtype(dtype)
    resolved_seed = _params.integer("seed", seed)
    cfg = SIZES[size]
    if batch_size is not None:
        cfg = dataclasses.replace(cfg, batch_size=_params.positive_int("batch_size", batch_size))
    if seq_len is not None:
        cfg = dataclasses.replace(cfg, seq_len=_params.positive_int("seq_len", seq_len))
    _runtime.check_step_fits(
        f"size={size}, batch_size={cfg.batch_size:,}, seq_len={cfg.seq_len:,}",
        step_floor(cfg), resolved_device, param_dtype, "batch_size or seq_len (or the size)",
    )

    with (
        _runtime.seeded(resolved_seed, resolved_device),
        _runtime.default_dtype(param_dtype),
        resolved_device,
    ):
        model = LlamaLM(cfg)
    optimizer = _runtime.adamw(model, lr=LEARNING_RATE)
    generator = _runtime.data_generator(resolved_seed, resolved_device)
    return Workload(
        model=model,
        step=training_step(model, optimizer, cfg, generator),
        tokens_per_step=cfg.batch_size * cfg.seq_len,
        optimizer=optimizer,
        name=f"llama-{size}",
        eval_losses=_runtime.held_out_losses(
            model,
            model,
            seed=resolved_seed,
            vocab_size=cfg.vocab_size,
            seq_len=cfg.seq_len,
            batch_size=cfg.batch_size,
            device=resolved_device,
        ),
        params={
            "size": size,
            "device": str(resolved_device),
            "dtype": _params.dtype_name(param_dtype),
            "seed": resolved_seed,
            "batch_size": cfg.batch_size,
            "seq_len": cfg.seq_len,
        },
        device=resolved_device,
    )


def step_floor(cfg: LlamaConfig) -> _runtime.StepFloor:
    """The least one step of a model of these shapes holds (the ``hf`` workload's too): the
    embedding (counted once, as if the head were tied), the attention's query and output and
    the MLP's three projections of every layer; the token ids; each layer's input; the logits."""
    tokens = cfg.batch_size * cfg.seq_len
    return _runtime.StepFloor(
        parameters=cfg.vocab_size * cfg.width
        + cfg.layers * (2 * cfg.width * cfg.width + 3 * cfg.width * cfg.ffn),
        batch_bytes=cfg.batch_size * (cfg.seq_len + 1) * 8,
        kept_per_block=tokens * cfg.width,
        num_blocks=cfg.layers,
        logits=tokens * cfg.vocab_size,
    )


def training_step(
    model: LlamaLM,
    optimizer: torch.optim.Optimizer,
    cfg: LlamaConfig,
    generator: torch.Generator,
) -> Callable[[], torch.Tensor]:
    """The step: random tokens, next-token cross-entropy, backward, AdamW; returns the loss."""
    device = generator.device

    def step() -> torch.Tensor:
        tokens = torch.randint(
            0, cfg.vocab_size, (cfg.batch_size, cfg.seq_len + 1), generator=generator, device=device
        )
        with _runtime.autocast(device):
            logits_btv = model(tokens[:, :-1])
            loss = F.cross_entropy(logits_btv.flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    return step
