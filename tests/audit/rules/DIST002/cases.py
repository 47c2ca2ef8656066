"""DIST002 fixtures: an MLP in DDP over a one-rank gloo group in this process, with and without
find_unused_parameters, and with a parameter that really goes unused."""

# fmt: off
# (the cases are laid out by hand: tests find the lines marked `# mark: <case>`)

import torch
from ddp_in_process import ddp

from levers import Workload


class TwoHeads(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Linear(16, 16)
        self.used = torch.nn.Linear(16, 4)
        self.unused = torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.used(self.body(x))


class AllUsed(TwoHeads):
    def forward(self, x):
        h = self.body(x)  # mark: fire_nothing_unused
        return self.used(h) + self.unused(h)


def _workload(module_class, **ddp_kwargs):
    torch.manual_seed(0)
    model = ddp(module_class(), **ddp_kwargs)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(4, 16)

    def step():
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()

    return Workload(model=model, step=step, optimizer=opt, name="dist002")


def fire_nothing_unused():
    return _workload(AllUsed, find_unused_parameters=True)


def ok_really_unused():
    return _workload(TwoHeads, find_unused_parameters=True)


def ok_flag_off():
    return _workload(AllUsed)


def ok_static_graph():
    return _workload(AllUsed, find_unused_parameters=True, static_graph=True)
