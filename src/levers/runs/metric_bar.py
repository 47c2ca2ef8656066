"""A metric's kill line: worse than its bar for some evals in a row. Its own module because both
the run guard (:mod:`levers.runs.guards`) and a run pre-registration's settings
(:mod:`levers.runs.prereg`) build it, and the pre-registration must not import the guard (which
imports torch and reads the pre-registration)."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class MetricBar:
    """Kill when ``name`` is worse than ``bar`` for ``num_evals`` evals in a row after a step."""

    name: str
    bar: float
    better: str = "lower"  # "lower": worse means above the bar
    num_evals: int = 3
    after_step: int = 0  # only evals at steps > after_step count

    def __post_init__(self) -> None:
        if self.better not in ("lower", "higher"):
            raise ValueError(f"MetricBar.better must be 'lower' or 'higher', got {self.better!r}")
        if not isinstance(self.num_evals, int) or self.num_evals < 1:
            raise ValueError(
                f"MetricBar.num_evals must be a positive integer, got {self.num_evals!r}",
            )

    def is_worse(self, value: float) -> bool:
        if not math.isfinite(value):
            return True
        return value > self.bar if self.better == "lower" else value < self.bar
