"""ATTN002 fixtures: attention written out by hand, and attention-like code that is not."""

# fmt: off
# (the cases are laid out by hand: tests find the lines marked `# mark: <case>`)

import torch
import torch.nn.functional as F

from levers import Workload


class Heads(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(32, 3 * 32)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, 4, 8).permute(2, 0, 3, 1, 4).unbind(0)
        return q, k, v


class EinsumAttention(Heads):
    def forward(self, x):
        q, k, v = super().forward(x)
        valid = torch.ones(x.shape[0], x.shape[1], dtype=torch.bool)
        scores = torch.einsum("bhqe,bhke->bhqk", q * 8**-0.5, k)  # mark: fire_einsum_masked
        scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
        probs = scores.float().softmax(dim=-1).to(q.dtype)
        return torch.einsum("bhqk,bhke->bhqe", probs, v)


class MatmulAttention(Heads):
    def forward(self, x):
        q, k, v = super().forward(x)
        weights = torch.matmul(q, k.transpose(2, 3)) * 8**-0.5  # mark: fire_matmul_unmasked
        weights = F.softmax(weights, dim=-1, dtype=torch.float32).to(q.dtype)
        return torch.matmul(weights, v)


class SdpaAttention(Heads):
    def forward(self, x):
        q, k, v = super().forward(x)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class Router(torch.nn.Module):
    """A softmax over experts: no score matrix, no second matmul."""

    def __init__(self):
        super().__init__()
        self.gate = torch.nn.Linear(32, 8)

    def forward(self, x):
        probs = self.gate(x).softmax(dim=-1)
        return probs.topk(2, dim=-1).values.sum(-1, keepdim=True) * x


def _workload(module):
    torch.manual_seed(0)
    opt = torch.optim.SGD(module.parameters(), lr=0.1)
    x = torch.randn(2, 16, 32)

    def step():
        module(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()

    return Workload(model=module, step=step, optimizer=opt, name="attn002")


def fire_einsum_masked():
    return _workload(EinsumAttention())


def fire_matmul_unmasked():
    return _workload(MatmulAttention())


def ok_sdpa():
    return _workload(SdpaAttention())


def ok_router_softmax():
    return _workload(Router())


def regress_two_blocks():
    return _workload(torch.nn.Sequential(Stack(), Stack()))


class Stack(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = MatmulAttention()
        self.out = torch.nn.Linear(32, 32)

    def forward(self, x):
        b, t, _ = x.shape
        return self.out(self.attn(x).transpose(1, 2).reshape(b, t, 32)) + x
