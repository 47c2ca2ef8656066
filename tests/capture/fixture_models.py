"""Small workloads with known ops, used by the capture tests.

Lines that tests look up carry a ``# mark: NAME`` comment; tests find their line numbers by
reading this file, so editing the file does not silently break the expectations.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.checkpoint import checkpoint

from levers import Workload


class Attn(nn.Module):
    def __init__(self, dim: int = 16, heads: int = 4, kv_heads: int = 2) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.q = nn.Linear(dim, dim, bias=False)
        self.kv = nn.Linear(dim, 2 * kv_heads * self.head_dim, bias=False)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q = self.q(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k, v = self.kv(x).view(b, t, 2, self.kv_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.MATH]):
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)  # mark: sdpa
        return o.transpose(1, 2).reshape(b, t, d)


class Block(nn.Module):
    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.attn = Attn(dim)
        self.fc = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(x, mask)
        return x + self.fc(x).relu()  # mark: mlp


class Net(nn.Module):
    def __init__(self, checkpointing: bool = False, vocab: int = 12) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(16, vocab, bias=False)
        self.checkpointing = checkpointing

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            if self.checkpointing:
                x = checkpoint(block, x, mask, use_reentrant=False)  # mark: checkpoint
            else:
                x = block(x, mask)
        return self.head(x)  # mark: head


def net(
    checkpointing: bool = False, seed: int = 0, optimizer: str = "adamw", device: str = "cpu"
) -> Workload:
    """Two attention blocks, a head, cross-entropy with ignored targets, one sync of each kind."""
    torch.manual_seed(seed)
    model = Net(checkpointing).to(device)
    if optimizer == "adamw":
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
    gen = torch.Generator(device).manual_seed(seed)
    mask = torch.zeros(6, 6, device=device)

    def step() -> torch.Tensor:
        x = torch.randn(2, 6, 16, generator=gen, device=device)
        target = torch.randint(0, 12, (2, 6), generator=gen, device=device)
        target[:, 4:] = -100
        logits = model(x, mask)
        loss = F.cross_entropy(logits.flatten(0, 1), target.flatten(), ignore_index=-100)  # mark: loss
        valid = target >= 0
        num_valid = int(valid.sum())  # mark: int
        if bool(valid.any()):  # mark: bool
            pass
        picked = logits[valid]  # mark: boolindex
        loss.backward()
        opt.step()
        opt.zero_grad()
        torch.cuda.max_memory_allocated()  # mark: maxmem
        return loss + 0 * num_valid + 0 * picked.sum().detach()

    return Workload(model=model, step=step, optimizer=opt, name="net", tokens_per_step=12)


def linear(seed: int = 0) -> Workload:
    """One Linear layer and plain SGD: a step whose every op is known."""
    torch.manual_seed(seed)
    model = nn.Linear(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, foreach=False)
    x = torch.randn(5, 4)

    def step() -> torch.Tensor:
        loss = model(x).sum()  # mark: linear
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return Workload(model=model, step=step, optimizer=opt, name="linear", tokens_per_step=5)


def allocations() -> Workload:
    """A step that allocates two 1 MiB tensors and frees both: a known memory profile."""
    model = nn.Module()

    def step() -> None:
        a = torch.zeros(262144)  # 1 MiB of float32
        b = a + 1
        del a, b

    return Workload(model=model, step=step, name="allocations")


def raising() -> Workload:
    model = nn.Linear(2, 2)

    def step() -> None:
        model(torch.randn(3, 2))
        raise RuntimeError("boom in the step")  # mark: raise

    return Workload(model=model, step=step, name="raising")
