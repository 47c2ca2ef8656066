"""Calling one side's step: the loss it returns and the errors it raises."""

from __future__ import annotations

from typing import Any

import torch

from levers.ab.killlines import interrupted, step_error
from levers.capture.loss import find_loss
from levers.workload import Workload


def loss_of(value: Any) -> torch.Tensor | float | None:
    """The scalar loss a step returned, detached and without a host sync; None if there is none."""
    return find_loss(value).value


def unreadable_loss(workload: Workload) -> str | None:
    """Why no loss could be read from this workload's last step return, or None if one was."""
    return _UNREADABLE.get(id(workload))


# id(workload) -> why its last step gave no readable loss (kept per run; workloads live as long)
_UNREADABLE: dict[int, str] = {}


def run_step(workload: Workload, phase: str, side: str, step: int) -> torch.Tensor | float | None:
    """One step of one side; an exception from the user's step becomes a step_error kill."""
    try:
        value = workload.step()
    except KeyboardInterrupt:
        raise interrupted(phase, side, step) from None
    except Exception as exc:  # the user's code may raise anything; the run records it
        raise step_error(exc, phase, side, step) from exc
    found = find_loss(value)
    if found.value is None:
        _UNREADABLE[id(workload)] = found.why_none
    else:
        _UNREADABLE.pop(id(workload), None)
    return found.value
