"""A tiny workload whose model draws random numbers (dropout): tune's compiled trials on it."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from levers import Workload


class Net(torch.nn.Module):
    def __init__(self, dim: int, p: float) -> None:
        super().__init__()
        self.up = torch.nn.Linear(dim, 4 * dim)
        self.down = torch.nn.Linear(4 * dim, dim)
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.dropout(F.gelu(self.up(x)), self.p, self.training))


def build(dim: int = 16, p: float = 0.1, batch_size: int = 8, device: str = "cpu") -> Workload:
    torch.manual_seed(0)
    model = Net(dim, p).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(batch_size, dim).to(device)
    y = torch.randn(batch_size, dim).to(device)

    def step() -> torch.Tensor:
        loss = F.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    return Workload(model=model, step=step, optimizer=optimizer, tokens_per_step=batch_size,
                    name="dropout-mlp", params={"dim": dim, "p": p, "batch_size": batch_size,
                            "device": device})
