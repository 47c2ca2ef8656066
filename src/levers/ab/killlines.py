"""Kill lines: conditions that stop a comparison early, with the reason recorded.

A kill never throws away what was measured: each phase catches :class:`KillSignal`, keeps its
partial samples and hands the :class:`Kill` up, and the record is written marked as killed.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from levers.errors import user_traceback

GIB = 1024**3

KINDS = ("nonfinite_loss", "memory_gate", "time_budget", "step_error", "interrupted")


@dataclass(frozen=True)
class Kill:
    """Why and where a comparison stopped."""

    kind: str  # one of KINDS
    reason: str  # a sentence for the user
    phase: str  # "build", "parity", "warmup", "timed"
    side: str | None  # "baseline", "candidate" or None
    step: int | None  # 1-based step of that phase
    user_traceback: str | None = None  # step_error: the frames of the user's code
    # what to do about it in ab's own words ("raise --time-budget-s"); a caller that set the
    # line itself (levers tune gives each A/B the time left) says its own instead
    advice: str = ""

    @property
    def message(self) -> str:
        """The reason with ab's advice, as ab prints it."""
        return f"{self.reason}; {self.advice}" if self.advice else self.reason


class KillSignal(Exception):
    """Carries a Kill out of nested loops; never escapes the runner."""

    def __init__(self, kill: Kill) -> None:
        super().__init__(kill.message)
        self.kill = kill


@dataclass(frozen=True)
class KillLines:
    """The limits of one run. None disables a line; non-finite loss always stops a run."""

    mem_gate_bytes: int | None = None
    time_budget_s: float | None = None
    started_s: float = 0.0  # time.perf_counter() when the run started


def time_left_s(lines: KillLines) -> float | None:
    """What is left of the time budget now (negative once spent); None without one."""
    if lines.time_budget_s is None:
        return None
    return lines.time_budget_s - (time.perf_counter() - lines.started_s)


def check_time(lines: KillLines, phase: str, side: str | None, step: int | None) -> None:
    left_s = time_left_s(lines)
    if left_s is not None and left_s < 0:
        raise _time_budget_kill(
            lines, f"before {side or 'the'} {phase} step {step}",
            "raise --time-budget-s or lower --steps", phase, side, step,
        )


def over_time(lines: KillLines, phase: str, side: str | None, step: int | None) -> KillSignal:
    """The time budget ended inside a step (:mod:`levers.ab.steps` stops it there)."""
    return _time_budget_kill(
        lines, f"during {side or 'the'} {phase} step {step}, which was stopped there (a first "
        "step compiles)", "raise --time-budget-s", phase, side, step,
    )


def _time_budget_kill(
    lines: KillLines, where: str, advice: str, phase: str, side: str | None, step: int | None
) -> KillSignal:
    elapsed_s = time.perf_counter() - lines.started_s
    return KillSignal(
        Kill(
            kind="time_budget",
            reason=f"time budget of {lines.time_budget_s:g} s spent ({elapsed_s:.1f} s) {where}",
            advice=advice,
            phase=phase,
            side=side,
            step=step,
        )
    )


def check_loss(loss: float | None, phase: str, side: str, step: int) -> None:
    if loss is None or math.isfinite(loss):
        return
    raise KillSignal(
        Kill(
            kind="nonfinite_loss",
            reason=f"{side} loss is {loss} at {phase} step {step}; the run is stopped",
            phase=phase,
            side=side,
            step=step,
        )
    )


def check_memory(
    lines: KillLines, peak_bytes: int | None, phase: str, side: str, step: int
) -> None:
    if lines.mem_gate_bytes is None or peak_bytes is None or peak_bytes <= lines.mem_gate_bytes:
        return
    raise KillSignal(
        Kill(
            kind="memory_gate",
            reason=(
                f"{side} peak allocated {peak_bytes / GIB:.2f} GiB at {phase} step {step} exceeds "
                f"the memory gate of {lines.mem_gate_bytes / GIB:.2f} GiB"
            ),
            phase=phase,
            side=side,
            step=step,
        )
    )


def step_error(exc: BaseException, phase: str, side: str, step: int) -> KillSignal:
    return KillSignal(
        Kill(
            kind="step_error",
            reason=f"{side} {phase} step {step} raised {type(exc).__name__}: {exc}",
            phase=phase,
            side=side,
            step=step,
            user_traceback=user_traceback(exc),
        )
    )


def interrupted(phase: str, side: str, step: int) -> KillSignal:
    """Ctrl-C during a step: stop, and keep what was measured before it (a partial result)."""
    return KillSignal(
        Kill(
            kind="interrupted",
            reason=f"interrupted (Ctrl-C) during {side} {phase} step {step}",
            phase=phase,
            side=side,
            step=step,
        )
    )
