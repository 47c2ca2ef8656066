"""MEM001 fixtures: blocks whose activations dominate the step's memory, with and without
checkpointing, and a parameter-heavy step where they do not."""

# fmt: off
# (the cases are laid out by hand: tests find the lines marked `# mark: <case>`)

import torch
from torch.utils.checkpoint import checkpoint

from levers import Workload


class Block(torch.nn.Module):
    def __init__(self, width=64, hidden=256):
        super().__init__()
        self.up = torch.nn.Linear(width, hidden)
        self.down = torch.nn.Linear(hidden, width)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(x)))


class Net(torch.nn.Module):
    def __init__(self, checkpointing=False, n=4, **block):
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block(**block) for _ in range(n))
        self.checkpointing = checkpointing

    def forward(self, x):
        for block in self.blocks:
            if self.checkpointing:
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)  # mark: fire_activations_dominate
        return x


def _workload(batch, **net):
    torch.manual_seed(0)
    model = Net(**net)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(batch, 64)

    def step():
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return Workload(model=model, step=step, optimizer=opt, name="mem001")


def fire_activations_dominate():
    return _workload(512)


def ok_checkpointed():
    return _workload(512, checkpointing=True)


def ok_parameters_dominate():
    return _workload(2, hidden=4096)
