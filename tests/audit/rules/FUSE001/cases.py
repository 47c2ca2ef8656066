"""FUSE001 fixtures: a SwiGLU MLP written as silu and mul, a GeGLU, and plain MLPs."""

# fmt: off
# (the cases are laid out by hand: tests find the lines marked `# mark: <case>`)

import torch
import torch.nn.functional as F

from levers import Workload


class GatedMLP(torch.nn.Module):
    def __init__(self, act=F.silu, width=32, ffn=64):
        super().__init__()
        self.gate = torch.nn.Linear(width, ffn, bias=False)
        self.up = torch.nn.Linear(width, ffn, bias=False)
        self.down = torch.nn.Linear(ffn, width, bias=False)
        self.act = act

    def forward(self, x):
        return self.down(self.act(self.gate(x)) * self.up(x))  # mark: fire_swiglu fire_geglu


class PlainMLP(GatedMLP):
    def forward(self, x):
        return self.down(self.act(self.gate(x)))


class SiluScaled(GatedMLP):
    """silu times a constant: a product, but not with a tensor of the activation's shape."""

    def forward(self, x):
        return self.down(self.act(self.gate(x)) * self.up.weight.new_ones(()))


def _workload(mlp, n=2):
    torch.manual_seed(0)
    model = torch.nn.Sequential(*(mlp() for _ in range(n)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(2, 8, 32)

    def step():
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()

    return Workload(model=model, step=step, optimizer=opt, name="fuse001")


def fire_swiglu():
    return _workload(GatedMLP)


def fire_geglu():
    return _workload(lambda: GatedMLP(act=F.gelu))


def ok_plain_mlp():
    return _workload(PlainMLP)


def ok_silu_times_scalar():
    return _workload(SiluScaled)
