"""Small workloads whose memory can be worked out by hand, for the memory tests.

Every factory takes ``device`` (the prediction passes ``cuda``) and builds its tensors there.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from levers.workload import Workload

BATCH = 8


def mlp(device: str = "cpu", batch_size: int = BATCH, fused: bool = True) -> Workload:
    """Linear(16, 32) -> ReLU -> Linear(32, 4), float32, MSE loss, AdamW.

    Parameters: 16*32*4 + 32*4 + 32*4*4 + 4*4 = 2048 + 128 + 512 + 16 = 2704 bytes.
    """
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=fused)

    def step() -> torch.Tensor:
        x = torch.randn(batch_size, 16, device=device)
        target = torch.randn(batch_size, 4, device=device)
        loss = F.mse_loss(model(x), target)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    return Workload(
        model=model, step=step, optimizer=optimizer, name="mlp", params={"batch_size": batch_size}
    )


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.up = nn.Linear(width, 4 * width, bias=False)
        self.down = nn.Linear(4 * width, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x)))


class Stack(nn.Module):
    def __init__(self, width: int, depth: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def stack(device: str = "cpu", batch_size: int = 64, width: int = 256, depth: int = 4) -> Workload:
    """``depth`` residual MLP blocks in an nn.ModuleList; activations grow with batch_size."""
    torch.manual_seed(0)
    model = Stack(width, depth).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)

    def step() -> torch.Tensor:
        x = torch.randn(batch_size, width, device=device)
        loss = model(x).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    return Workload(
        model=model, step=step, optimizer=optimizer, name="stack", params={"batch_size": batch_size}
    )


def huge(device: str = "cpu") -> Workload:
    """A 10 GB parameter matrix: only a fake run can build it on a small machine."""
    model = nn.Linear(50_000, 50_000, bias=False, device=device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)

    def step() -> torch.Tensor:
        loss = model(torch.randn(2, 50_000, device=device)).sum()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    return Workload(model=model, step=step, optimizer=optimizer, name="huge")


def data_dependent(device: str = "cpu") -> Workload:
    """A step that reads device values: a count from a mask, a branch, boolean indexing."""
    model = nn.Linear(8, 8, device=device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    labels = torch.tensor([1, -100, 3, -100, 5, 6, -100, 7], device=device)

    def step() -> torch.Tensor:
        valid = labels != -100
        count = int(valid.sum())  # 5
        hidden = model(torch.randn(8, 8, device=device))
        if bool((labels > 100).any()):
            hidden = hidden * 2
        picked = hidden[valid]  # 5 rows
        loss = picked.sum() / count + hidden[:count].sum()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    return Workload(model=model, step=step, optimizer=optimizer, name="data_dependent")


def drawn_targets(device: str = "cpu", collator: bool = False, tokens: int = 4096) -> Workload:
    """A masked LM's targets drawn each step, 15% of the tokens (``torch.rand(...) < 0.15``, or
    ``torch.bernoulli`` of a ``torch.full`` of 0.15 as Hugging Face's collator draws them), on a
    generator of the device; the projection and the loss then take the rows with a target only,
    as loss-valid-rows does. A dropout on the hidden states draws too, and nothing reads it."""
    model = nn.Linear(8, 512, device=device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    generator = torch.Generator(device=device)
    generator.manual_seed(0)

    def step() -> torch.Tensor:
        if collator:
            chance = torch.full((tokens,), 0.15, device=device)
            masked = torch.bernoulli(chance, generator=generator).bool()
        else:
            masked = torch.rand((tokens,), generator=generator, device=device) < 0.15
        labels = torch.where(masked, torch.arange(tokens, device=device) % 512, -100)
        hidden = nn.functional.dropout(torch.randn(tokens, 8, device=device), 0.1)
        rows = (labels != -100).nonzero().squeeze(1)  # the rows with a target: ~15%
        logits = model(hidden.index_select(0, rows))
        loss = nn.functional.cross_entropy(logits.float(), labels.index_select(0, rows))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    return Workload(model=model, step=step, optimizer=optimizer, name="drawn_targets")


def device_moves(device: str = "cpu") -> Workload:
    """Built on the host and moved, with a host copy, a generator and a device check."""
    model = nn.Linear(4, 4)
    model = model.to(device)
    generator = torch.Generator(device=device)
    generator.manual_seed(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    seen = {}

    def step() -> torch.Tensor:
        x = torch.randn(2, 4, generator=generator, device=generator.device)
        seen["x_device"] = x.device.type
        seen["is_cuda"] = x.is_cuda
        loss = model(x).sum()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        seen["host_copy"] = loss.detach().cpu()
        return loss.detach()

    workload = Workload(model=model, step=step, optimizer=optimizer, name="device_moves")
    workload.params = {"seen": seen}
    return workload


class AttentionBlock(nn.Module):
    """Attention whose SDPA call sits in a plain method, not in a submodule's forward."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width, bias=False)
        self.out = nn.Linear(width, width, bias=False)

    def attend(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = (
            t.view(batch, length, self.heads, -1).transpose(1, 2)
            for t in self.qkv(x).chunk(3, dim=-1)
        )
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return out.transpose(1, 2).reshape(batch, length, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.out(self.attend(x))


def attention_stack(
    device: str = "cpu", batch_size: int = 4, length: int = 128, width: int = 256, depth: int = 3
) -> Workload:
    """``depth`` attention blocks in bfloat16; a gradient hook records what backward sees."""
    torch.manual_seed(0)
    model = nn.Module()
    model.blocks = nn.ModuleList(AttentionBlock(width, heads=4) for _ in range(depth))
    model = model.to(device=device, dtype=torch.bfloat16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    seen = {}

    def record(grad: torch.Tensor) -> None:
        seen["grad_is_cuda"] = grad.is_cuda

    def step() -> torch.Tensor:
        x = torch.randn(batch_size, length, width, device=device, dtype=torch.bfloat16)
        for block in model.blocks:
            x = block(x)
        x.register_hook(record)
        loss = x.float().square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    workload = Workload(model=model, step=step, optimizer=optimizer, name="attention_stack")
    workload.params = {"seen": seen}
    return workload


class _Scale(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))  # small: its values are shadowed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight


def retyped(device: str = "cpu") -> Workload:
    """A module cast while the model is built (DeepSeek-V4's norms: ``.to(dtype=float32)`` in
    their ``__init__``)."""
    with torch.device(device):
        model = nn.Sequential(nn.Linear(8, 8), _Scale(8).to(dtype=torch.float32))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)

    def step() -> torch.Tensor:
        loss = model(torch.randn(4, 8, device=device)).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    return Workload(model=model, step=step, optimizer=optimizer, name="retyped")
