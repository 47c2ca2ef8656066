"""Helpers for the lever parity tests: losses and gradients of a few steps, off vs on."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from levers.levers._patch import set_attr
from levers.workload import Workload


@dataclass
class Trace:
    losses: list[torch.Tensor]
    grads: list[dict[str, torch.Tensor]]  # per step, at optimizer.step(), by parameter name


def run_steps(workload: Workload, num_steps: int = 2) -> Trace:
    """Run ``num_steps`` steps, keeping each loss and the gradients seen by optimizer.step()."""
    optimizer = workload.optimizer
    names = {id(p): n for n, p in workload.model.named_parameters()}
    grads: list[dict[str, torch.Tensor]] = []
    original = optimizer.step

    def step(*args, **kwargs):
        grads.append(
            {
                names[id(p)]: p.grad.detach().clone()
                for group in optimizer.param_groups
                for p in group["params"]
                if p.grad is not None
            }
        )
        return original(*args, **kwargs)

    # an instance step a lever set (the optimizer-state levers) is put back, not deleted
    undo = set_attr(optimizer, "step", step)
    try:
        losses = [torch.as_tensor(workload.step()).detach().clone() for _ in range(num_steps)]
    finally:
        undo()
    return Trace(losses, grads)


def assert_bitwise(a: Trace, b: Trace) -> None:
    assert len(a.losses) == len(b.losses)
    for la, lb in zip(a.losses, b.losses):
        assert torch.equal(la, lb), (la, lb)
    for ga, gb in zip(a.grads, b.grads):
        assert ga.keys() == gb.keys()
        for name in ga:
            assert torch.equal(ga[name], gb[name]), name


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def assert_close(a: Trace, b: Trace, rtol: float, *, grad_rtol: float | None = None) -> None:
    grad_rtol = rtol if grad_rtol is None else grad_rtol
    for la, lb in zip(a.losses, b.losses):
        assert relative(la, lb) <= rtol, (la, lb)
    for ga, gb in zip(a.grads, b.grads):
        assert ga.keys() == gb.keys()
        for name in ga:
            assert relative(ga[name], gb[name]) <= grad_rtol, (name, relative(ga[name], gb[name]))


def state_of(model: torch.nn.Module) -> tuple[dict, dict]:
    """The state_dict (cloned) and every module's own attribute names, to compare after undo."""
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    attrs = {name: sorted(vars(m)) for name, m in model.named_modules()}
    return state, attrs


def assert_restored(model: torch.nn.Module, before: tuple[dict, dict]) -> None:
    state, attrs = state_of(model)
    assert attrs == before[1]
    assert state.keys() == before[0].keys()
    for key in state:
        assert torch.equal(state[key], before[0][key]), key
