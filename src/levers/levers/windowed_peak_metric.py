"""``windowed-peak-metric``: reset the CUDA peak-memory statistics at the start of every step.

A ``max_memory_allocated()`` read in the step then reports that step's peak (a window), not the
run's lifetime maximum so far. The step is wrapped; nothing else changes. On a machine without
CUDA the reset is skipped, as the metric is.

Fix safety: exact (training is unaffected; only the metric's meaning changes).
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch

from levers.levers import register
from levers.levers.lever import Lever, Target
from levers.vocab import EXACT

MARK = "_levers_windowed_peak"


def windowed(step: Callable[[], Any]) -> Callable[[], Any]:
    @functools.wraps(step)
    def step_with_window() -> Any:
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        return step()

    setattr(step_with_window, MARK, True)
    return step_with_window


def applies(target: Target) -> str | None:
    if target.step is None:
        return "it wraps the training step: pass the step (levers.apply(model, ..., step=fn))"
    if getattr(target.step, MARK, False):
        return "the step already resets the peak statistics (applied before)"
    return None


def patch(target: Target) -> Callable[[], None]:
    original = target.step
    target.step = windowed(original)

    def undo() -> None:
        target.step = original

    return undo


LEVER = register(
    Lever(
        id="windowed-peak-metric",
        title="Reset the peak memory statistics at each step, so the peak read is the step's",
        safety=EXACT,
        fixes=("MEM002",),
        applies=applies,
        patch=patch,
        observes_only=True,  # the step computes the same; only the peak read changes
    )
)
