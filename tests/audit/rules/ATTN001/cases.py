"""ATTN001 fixtures: SDPA calls whose GPU backend the rule decides from the recorded arguments.

The shapes are tiny; the rule reasons about the target GPU (h100 unless CONFIG says otherwise)
and torch 2.11's dispatch rules, with float32 CPU inputs assumed bf16 on the GPU.
"""

# fmt: off
# (the cases are laid out by hand: tests find the lines marked `# mark: <case>`)

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from levers import Workload

PIN = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


class Attention(torch.nn.Module):
    def __init__(self, heads=4, kv_heads=2, head_dim=16):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q = torch.nn.Linear(32, heads * head_dim)
        self.kv = torch.nn.Linear(32, 2 * kv_heads * head_dim)

    def split(self, x):
        b, t, _ = x.shape
        q = self.q(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k, v = self.kv(x).view(b, t, 2, self.kv_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        return q, k, v


def _workload(attend, **attention):
    torch.manual_seed(0)
    model = Attention(**attention)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(2, 8, 32)

    def step():
        q, k, v = model.split(x)
        out = attend(q, k, v)
        out.float().pow(2).mean().backward()
        opt.step()
        opt.zero_grad()

    return Workload(model=model, step=step, optimizer=opt, name="attn001")


def _mask():
    return torch.zeros(1, 1, 8, 8)


def fire_pinned_mask_gqa():
    def attend(q, k, v):
        with sdpa_kernel(PIN):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=_mask(), enable_gqa=True)  # mark: fire_pinned_mask_gqa

    return _workload(attend)


def fire_fp32_mask_gqa():
    def attend(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=_mask(), enable_gqa=True)  # mark: fire_fp32_mask_gqa

    return _workload(attend)


def ok_causal_gqa():
    def attend(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    return _workload(attend)


def ok_mask_gqa_unpinned():
    def attend(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=_mask(), enable_gqa=True)

    return _workload(attend)


def ok_pinned_cudnn_mask_gqa():
    def attend(q, k, v):
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION, SDPBackend.MATH]):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=_mask(), enable_gqa=True)

    return _workload(attend)


def regress_efficient_with_cudnn_pinned_out():
    # equal head counts: EFFICIENT takes the mask and runs, but cuDNN, faster, is pinned out
    def attend(q, k, v):
        with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=_mask())

    return _workload(attend, kv_heads=4)


def regress_a100_mask_gqa_unpinned():
    # on sm80 PyTorch tries MATH before cuDNN: the unpinned call still runs MATH
    def attend(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=_mask(), enable_gqa=True)

    return _workload(attend)


def regress_head_dim_256():
    def attend(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=_mask(), enable_gqa=True)

    return _workload(attend, head_dim=256)


def regress_torch_2_14_efficient_gqa():
    # from torch 2.14 (assumed) EFFICIENT takes GQA: it runs, but cuDNN is faster and pinned out
    def attend(q, k, v):
        with sdpa_kernel(PIN):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=_mask(), enable_gqa=True)

    return _workload(attend)


CONFIG = {
    "fire_fp32_mask_gqa": {"assume_dtype": "fp32"},
    "regress_a100_mask_gqa_unpinned": {"target": "a100"},
    "regress_torch_2_14_efficient_gqa": {"torch_version": "2.14"},
}
