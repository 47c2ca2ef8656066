"""The workload: the unit every levers verb runs on.

A workload factory is a plain function that takes keyword parameters and returns a
:class:`Workload`. ``step()`` runs one full training step (forward, loss, backward, optimizer
step, zero_grad) and may return the loss.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:  # torch is imported when a Workload is made: `levers --help` goes without it
    import torch


@dataclass
class Workload:
    """One training step and what levers needs to know about it.

    Attributes:
        model: the ``nn.Module`` being trained; its ``named_modules()`` give module paths.
        step: runs one full training step and may return the loss.
        tokens_per_step: tokens (or samples) consumed per step, for tokens/s; optional.
        optimizer: the optimizer the step uses, so its ops are labelled as the optimizer phase.
        name: a short name shown in reports.
        params: the parameters the factory was called with (recorded in reports).
        device: the device the step runs on.
        eval_losses: optional; returns a 1-D tensor of per-example losses on a fixed held-out
            batch set (the same examples, in the same order, every call). ``levers ab`` pairs
            them between the sides as its quality read of a numerics-changing candidate.
    """

    model: torch.nn.Module
    step: Callable[[], Any]
    tokens_per_step: int | None = None
    optimizer: torch.optim.Optimizer | None = None
    name: str = "workload"
    params: dict[str, Any] = field(default_factory=dict)
    device: torch.device | None = None
    eval_losses: Callable[[], torch.Tensor] | None = None

    def __post_init__(self) -> None:
        import torch

        if not isinstance(self.model, torch.nn.Module):
            raise TypeError(
                f"Workload.model must be a torch.nn.Module, got {type(self.model).__name__}; "
                "pass the module being trained"
            )
        if not callable(self.step):
            raise TypeError(
                f"Workload.step must be callable, got {type(self.step).__name__}; pass a function "
                "that runs one training step"
            )
        if self.tokens_per_step is not None and (
            not isinstance(self.tokens_per_step, int) or self.tokens_per_step <= 0
        ):
            raise ValueError(
                f"Workload.tokens_per_step must be a positive int or None, got {self.tokens_per_step!r}"
            )
        if self.optimizer is not None and not isinstance(self.optimizer, torch.optim.Optimizer):
            raise TypeError(
                "Workload.optimizer must be a torch.optim.Optimizer or None, got "
                f"{type(self.optimizer).__name__}"
            )
        if self.eval_losses is not None and not callable(self.eval_losses):
            raise TypeError(
                "Workload.eval_losses must be callable or None: a function returning the "
                "per-example losses of a fixed held-out batch set"
            )
        if self.device is None:
            first = next(self.model.parameters(), None)
            self.device = first.device if first is not None else torch.device("cpu")
        else:
            self.device = torch.device(self.device)
