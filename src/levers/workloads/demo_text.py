"""The text decoder of the ``demo`` model.

One pass over the prefix (image + text tokens) fills a KV cache; the teacher-forced suffix then
runs every layer once more, attending to [prefix cache + suffix keys] under a dense additive mask
(full over the prefix, causal within the suffix). Layers use a fused QKV projection, grouped-query
attention, RoPE from one table shared by the whole forward, and a fused-gate SwiGLU MLP.

Shapes: B batch, S prefix length, T suffix length, D width, H query heads, K key/value heads,
E head dim, V vocabulary, F MLP width.

Lines marked ``# [demo:<flag>]`` hold the inefficiencies listed in :mod:`levers.workloads.demo`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.checkpoint import checkpoint

from levers.workloads._rope import apply_rope, rope_table
from levers.workloads.demo_config import DemoConfig, DemoFixes

# The suffix pin: it was meant as insurance against one cuDNN crash, but with a dense mask and
# GQA neither flash nor efficient attention accepts the call, so MATH is all that is left.
PIN_WITHOUT_CUDNN = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
PIN_WITH_CUDNN = [SDPBackend.CUDNN_ATTENTION, *PIN_WITHOUT_CUDNN]


def rms_norm_eager(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm written out by hand: about six elementwise kernels with fp32 intermediates."""
    # [demo:norm] A fused kernel (F.rms_norm) does this in one pass over x.
    normed = (x.float() * (x.float().pow(2).mean(-1, keepdim=True) + eps).rsqrt()).to(x.dtype)
    return weight * normed


class RMSNorm(nn.Module):
    def __init__(self, width: int, eps: float, *, fused: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps
        self.fused = fused

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused:
            # The fused kernel wants one dtype; under autocast x may be bf16 with fp32 weights.
            return F.rms_norm(x, self.weight.shape, self.weight.to(x.dtype), self.eps)
        return rms_norm_eager(x, self.weight, self.eps)


def suffix_mask(prefix_len: int, suffix_len: int, device: torch.device) -> torch.Tensor:
    """The dense additive mask [1, 1, T, S + T]: all of the prefix, causal within the suffix."""
    causal = torch.full((suffix_len, suffix_len), float("-inf"), device=device).triu(1)
    visible_prefix = torch.zeros(suffix_len, prefix_len, device=device)
    return torch.cat([visible_prefix, causal], dim=1)[None, None]


def suffix_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, *, admit_cudnn: bool
) -> torch.Tensor:
    """Suffix queries q [B, H, T, E] over [prefix cache + suffix] keys k, v [B, K, S + T, E]."""
    mask = mask.to(q.dtype)
    with sdpa_kernel(PIN_WITH_CUDNN if admit_cudnn else PIN_WITHOUT_CUDNN):
        # [demo:suffix_attn] Dense mask + enable_gqa under a pin without cuDNN: MATH on a GPU.
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)


class TextAttention(nn.Module):
    def __init__(self, cfg: DemoConfig, *, admit_cudnn: bool) -> None:
        super().__init__()
        self.num_heads = cfg.text_heads
        self.num_kv_heads = cfg.text_kv_heads
        self.head_dim = cfg.head_dim
        q_width, kv_width = cfg.text_heads * cfg.head_dim, cfg.text_kv_heads * cfg.head_dim
        self.qkv = nn.Linear(cfg.text_width, q_width + 2 * kv_width, bias=False)
        self.out = nn.Linear(q_width, cfg.text_width, bias=False)
        self.admit_cudnn = admit_cudnn

    def split_heads(self, x_btd: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q [B, H, T, E], k and v [B, K, T, E] from one fused projection (no RoPE yet)."""
        batch, length, _ = x_btd.shape
        q_width, kv_width = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        q, k, v = self.qkv(x_btd).split([q_width, kv_width, kv_width], dim=-1)
        q = q.view(batch, length, self.num_heads, self.head_dim).transpose(1, 2)
        k = k.view(batch, length, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(batch, length, self.num_kv_heads, self.head_dim).transpose(1, 2)
        return q, k, v

    def merge_heads(self, out_bhte: torch.Tensor) -> torch.Tensor:
        batch, _, length, _ = out_bhte.shape
        return self.out(out_bhte.transpose(1, 2).reshape(batch, length, -1))

    def prefix(
        self, x_bsd: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Causal self-attention over the prefix; also returns its keys and values for the cache."""
        q, k, v = self.split_heads(x_bsd)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.merge_heads(out), k, v

    def prefix_kv(
        self, x_bsd: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        _, k, v = self.split_heads(x_bsd)
        return apply_rope(k, cos, sin), v

    def suffix(
        self,
        x_btd: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache: tuple[torch.Tensor, torch.Tensor],
        mask: torch.Tensor,
    ) -> torch.Tensor:
        q, k, v = self.split_heads(x_btd)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        keys = torch.cat([cache[0], k], dim=2)
        values = torch.cat([cache[1], v], dim=2)
        out = suffix_attention(q, keys, values, mask, admit_cudnn=self.admit_cudnn)
        return self.merge_heads(out)


class SwiGLU(nn.Module):
    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.gate_up = nn.Linear(width, 2 * hidden, bias=False)
        self.down = nn.Linear(hidden, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


class TextLayer(nn.Module):
    def __init__(self, cfg: DemoConfig, fixes: DemoFixes) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.text_width, cfg.norm_eps, fused=fixes.norm)
        self.attn = TextAttention(cfg, admit_cudnn=fixes.suffix_attn)
        self.mlp_norm = RMSNorm(cfg.text_width, cfg.norm_eps, fused=fixes.norm)
        self.mlp = SwiGLU(cfg.text_width, cfg.text_ffn)

    def forward(
        self, x_bsd: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One prefix layer: the next hidden states and this layer's keys and values."""
        attn_out, k, v = self.attn.prefix(self.attn_norm(x_bsd), cos, sin)
        x_bsd = x_bsd + attn_out
        return x_bsd + self.mlp(self.mlp_norm(x_bsd)), k, v

    def prefix_kv(
        self, x_bsd: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.attn.prefix_kv(self.attn_norm(x_bsd), cos, sin)

    def suffix(
        self,
        x_btd: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache: tuple[torch.Tensor, torch.Tensor],
        mask: torch.Tensor,
    ) -> torch.Tensor:
        x_btd = x_btd + self.attn.suffix(self.attn_norm(x_btd), cos, sin, cache, mask)
        return x_btd + self.mlp(self.mlp_norm(x_btd))


class TokenEmbedding(nn.Module):
    """Two lookup tables: text ids in ``text``, the action ids after them in ``extension``.

    Two tables instead of one concatenated matrix avoid copying the whole vocabulary per call.
    """

    def __init__(self, base_vocab: int, extension_vocab: int, width: int, *, fix_syncs: bool):
        super().__init__()
        self.base_vocab = base_vocab
        self.text = nn.Embedding(base_vocab, width)
        self.extension = nn.Embedding(extension_vocab, width)
        self.fix_syncs = fix_syncs

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        is_extension = ids >= self.base_vocab
        # [demo:syncs] Branching on a device value copies it to the host and waits for the GPU.
        if not self.fix_syncs and not bool(is_extension.any()):
            return self.text(ids)
        text = self.text(ids.clamp(max=self.base_vocab - 1))
        extension = self.extension((ids - self.base_vocab).clamp(min=0))
        return torch.where(is_extension.unsqueeze(-1), extension, text)


class TextDecoder(nn.Module):
    def __init__(self, cfg: DemoConfig, fixes: DemoFixes) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = TokenEmbedding(
            cfg.base_vocab, cfg.extension_vocab, cfg.text_width, fix_syncs=fixes.syncs
        )
        self.layers = nn.ModuleList(TextLayer(cfg, fixes) for _ in range(cfg.text_layers))
        self.norm = RMSNorm(cfg.text_width, cfg.norm_eps, fused=fixes.norm)
        self.lm_head = nn.Linear(cfg.text_width, cfg.vocab_size, bias=False)
        self.checkpoint_layers = fixes.checkpointing

    def rope(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The RoPE table for prefix and suffix positions, built once per forward."""
        cfg = self.cfg
        return rope_table(cfg.prefix_len + cfg.suffix_len, cfg.head_dim, cfg.rope_theta, device)

    def prefix(
        self, x_bsd: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Run the prefix once and return every layer's (keys, values) for the suffix."""
        cache = []
        for layer in self.layers[:-1]:
            if self.checkpoint_layers:
                x_bsd, k, v = checkpoint(layer, x_bsd, cos, sin, use_reentrant=False)
            else:
                # [demo:checkpointing] Every layer's activations stay alive until backward.
                x_bsd, k, v = layer(x_bsd, cos, sin)
            cache.append((k, v))
        # Nothing reads the last layer's output over the prefix: only its keys and values.
        cache.append(self.layers[-1].prefix_kv(x_bsd, cos, sin))
        return cache

    def suffix(
        self,
        ids_bt: torch.Tensor,
        cache: list[tuple[torch.Tensor, torch.Tensor]],
        cos: torch.Tensor,
        sin: torch.Tensor,
    ) -> torch.Tensor:
        """Teacher-forced suffix over the prefix cache; returns the final-norm hidden states."""
        mask = suffix_mask(self.cfg.prefix_len, self.cfg.suffix_len, ids_bt.device)
        x_btd = self.embed(ids_bt)
        for layer, layer_cache in zip(self.layers, cache, strict=True):
            x_btd = layer.suffix(x_btd, cos, sin, layer_cache, mask)
        return self.norm(x_btd)
