"""FUSE002 fixtures: rotate-half RoPE on q and k, and halves concatenated without a rotation."""

# fmt: off
# (the cases are laid out by hand: tests find the lines marked `# mark: <case>`)

import torch

from levers import Workload


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


class Attention(torch.nn.Module):
    def __init__(self, width=32, heads=2, rope=True):
        super().__init__()
        self.qkv = torch.nn.Linear(width, 3 * width, bias=False)
        self.heads = heads
        self.rope = rope

    def forward(self, x, cos, sin):
        b, t, w = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, w // self.heads).transpose(1, 3).unbind(2)
        if self.rope:
            q = q * cos + rotate_half(q) * sin  # mark: fire_rope
            k = k * cos + rotate_half(k) * sin
        else:
            half = q.shape[-1] // 2
            q = torch.cat([q[..., half:], q[..., :half]], dim=-1) * cos + q
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return out.transpose(1, 2).reshape(b, t, w)


def _workload(rope, n=2):
    torch.manual_seed(0)
    model = torch.nn.ModuleList(Attention(rope=rope) for _ in range(n))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(2, 8, 32)
    angles = torch.arange(8.0)[:, None] * torch.arange(1.0, 17.0)[None, :] / 16
    cos, sin = angles.cos(), angles.sin()

    def step():
        h = x
        for layer in model:
            h = h + layer(h, cos, sin)
        h.pow(2).mean().backward()
        opt.step()
        opt.zero_grad()

    return Workload(model=model, step=step, optimizer=opt, name="fuse002")


def fire_rope():
    return _workload(True)


def ok_swap_halves_without_neg():
    return _workload(False)
