"""A compile lever applied again after its undo reuses what dynamo compiled the first time:
``levers tune -- python train.py`` undoes and applies the candidate's levers between windows of
one run of the script, and a retrace at each re-apply would be timed as warm-up (or, past dynamo's
recompile limit, leave a region uncompiled)."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

from levers.levers.handle import apply


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.relu(self.fc(x))


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block() for _ in range(3))
        self.head = torch.nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x).square().mean()


@pytest.mark.parametrize("lever", ["compile-blocks", "compile-model"])
def test_applied_again_after_its_undo_nothing_is_compiled_again(lever):
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(4, 16)

    def step() -> None:
        model(x).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    compiled = []
    for _ in range(3):
        handle = apply(model, f"{lever}:backend=aot_eager", optimizer=optimizer)
        step()
        step()
        compiled.append(counters["frames"]["ok"])
        handle.undo()
        step()  # eager, as the baseline's window runs
        assert all(getattr(m, "_compiled_call_impl", None) is None for m in model.modules())
    assert compiled[0] > 0
    assert compiled[1] == compiled[2] == compiled[0]
