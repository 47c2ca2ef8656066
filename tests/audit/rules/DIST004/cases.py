"""DIST004 fixtures: a 197k-parameter MLP in DDP over a one-rank gloo group in this process,
relabelled as a capture of 4 ranks (TRANSFORM): AdamW keeps 1.50 MiB of state."""

# fmt: off
# (the cases are laid out by hand: tests find the lines marked `# mark: <case>`)

import torch
from ddp_in_process import ddp, relabel_world

from levers import Workload


def _workload(make_optimizer, *, wrap=True):
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(3)])
    if wrap:
        model = ddp(model)
    opt = make_optimizer(model.parameters())
    x = torch.randn(4, 256)

    def step():
        loss = model(x).pow(2).mean()  # mark: fire_adamw_four_ranks
        loss.backward()
        opt.step()
        opt.zero_grad()

    return Workload(model=model, step=step, optimizer=opt, name="dist004")


def fire_adamw_four_ranks():
    return _workload(lambda p: torch.optim.AdamW(p, lr=1e-3))


def ok_one_rank():
    return _workload(lambda p: torch.optim.AdamW(p, lr=1e-3))


def ok_not_ddp():
    return _workload(lambda p: torch.optim.AdamW(p, lr=1e-3), wrap=False)


def ok_sgd_without_state():
    return _workload(lambda p: torch.optim.SGD(p, lr=1e-3))


TRANSFORM = {
    "fire_adamw_four_ranks": relabel_world(4),
    "ok_not_ddp": relabel_world(4),
    "ok_sgd_without_state": relabel_world(4),
}
