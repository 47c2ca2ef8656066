"""DIST001 fixtures: a six-layer MLP in DDP over a one-rank gloo group in this process (see
tests/ddp_in_process.py), with small and default bucket caps."""

# fmt: off
# (the cases are laid out by hand: tests find the lines marked `# mark: <case>`)

import torch
from ddp_in_process import ddp

from levers import Workload


def _workload(**ddp_kwargs):
    torch.manual_seed(0)
    model = ddp(torch.nn.Sequential(*[torch.nn.Linear(32, 32) for _ in range(6)]), **ddp_kwargs)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(4, 32)

    def step():
        loss = model(x).pow(2).mean()  # mark: fire_tiny_buckets regress_few_small_buckets
        loss.backward()
        opt.step()
        opt.zero_grad()

    return Workload(model=model, step=step, optimizer=opt, name="dist001")


def fire_tiny_buckets():
    return _workload(bucket_cap_mb=0.002)


def ok_default_cap():
    return _workload()


def ok_not_ddp():
    torch.manual_seed(0)
    model = torch.nn.Linear(32, 32)
    x = torch.randn(4, 32)

    def step():
        model(x).sum().backward()

    return Workload(model=model, step=step, name="plain")


def regress_few_small_buckets():
    # a cap below the default, but the model is small enough that it makes only 3 buckets
    return _workload(bucket_cap_mb=0.006)
