"""OPT001 fixtures. The rule only reads GPU captures, so the cases that should fire are CPU
captures relabelled as H100 captures (TRANSFORM); the optimizer ops are the same aten ops."""

# fmt: off
# (the cases are laid out by hand: tests find the lines marked `# mark: <case>`)

import torch
from audit_helpers import relabel_as_gpu

from levers import Workload


def _workload(make_optimizer):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 4))
    opt = make_optimizer(model.parameters())
    x = torch.randn(8, 16)

    def step():
        model(x).pow(2).mean().backward()
        opt.step()  # mark: fire_foreach_adamw
        opt.zero_grad()

    return Workload(model=model, step=step, optimizer=opt, name="opt001")


def fire_foreach_adamw():
    return _workload(lambda p: torch.optim.AdamW(p, lr=1e-3, foreach=True))


def ok_fused_adamw():
    return _workload(lambda p: torch.optim.AdamW(p, lr=1e-3, fused=True))


def ok_cpu_capture():
    return _workload(lambda p: torch.optim.AdamW(p, lr=1e-3, foreach=True))


def ok_rmsprop():
    return _workload(lambda p: torch.optim.RMSprop(p, lr=1e-3))


def regress_per_parameter_sgd():
    return _workload(lambda p: torch.optim.SGD(p, lr=1e-3, momentum=0.9, foreach=False))


TRANSFORM = {
    "fire_foreach_adamw": relabel_as_gpu,
    "ok_fused_adamw": relabel_as_gpu,
    "ok_rmsprop": relabel_as_gpu,
    "regress_per_parameter_sgd": relabel_as_gpu,
}
