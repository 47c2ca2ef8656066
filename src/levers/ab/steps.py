"""Calling one side's step: the loss it returns and the errors it raises."""

from __future__ import annotations

import warnings
from typing import Any

import torch

from levers.ab.killlines import step_error
from levers.workload import Workload


def loss_of(value: Any) -> torch.Tensor | float | None:
    """The scalar loss a step returned, detached and without a host sync; None if there is none."""
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            warnings.warn(
                f"step() returned a tensor of shape {tuple(value.shape)}, not a scalar loss; "
                "the loss is not compared and not checked for NaN",
                stacklevel=3,
            )
            return None
        return value.detach().reshape(())
    if isinstance(value, (int, float)):
        return float(value)
    return None


def run_step(workload: Workload, phase: str, side: str, step: int) -> torch.Tensor | float | None:
    """One step of one side; an exception from the user's step becomes a step_error kill."""
    try:
        value = workload.step()
    except Exception as exc:  # the user's code may raise anything; the run records it
        raise step_error(exc, phase, side, step) from exc
    return loss_of(value)
