"""Calling one side's step: the loss it returns and the errors it raises.

A step given kill lines (:class:`levers.ab.killlines.KillLines` with a time budget) is also
stopped inside itself when the budget ends while it runs: the first step of a compiled model
spends its whole compile in one call (timm's inception_resnet_v2 under whole-model compile:
~210 s on an H200), and a kill line checked only between steps let an A/B with 175 s left run
205 s, past the search's budget and through the time it kept for the A/Bs after it. The stop
is a ``SIGALRM`` timer armed for the time left around the step, on the main thread only and
only where nothing else handles that signal (a user's own alarm is left alone). A compile
stopped halfway leaves dynamo's caches half made, so dynamo is reset after it.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from levers.ab.killlines import KillLines, interrupted, over_time, step_error, time_left_s
from levers.capture.loss import find_loss
from levers.workload import Workload

# a stop that falls while a CUDA graph is being captured waits this long and looks again (an
# exception inside a capture leaves the stream capturing)
CAPTURE_RETRY_S = 0.25


def loss_of(value: Any) -> torch.Tensor | float | None:
    """The scalar loss a step returned, detached and without a host sync; None if there is none."""
    return find_loss(value).value


def unreadable_loss(workload: Workload) -> str | None:
    """Why no loss could be read from this workload's last step return, or None if one was."""
    return _UNREADABLE.get(id(workload))


# id(workload) -> why its last step gave no readable loss (kept per run; workloads live as long)
_UNREADABLE: dict[int, str] = {}


class _OverTime(BaseException):
    """Raised inside a step by the alarm when its time budget ends (a BaseException, as
    KeyboardInterrupt is: dynamo and inductor re-raise those rather than wrap them)."""


def _capturing() -> bool:
    return (
        torch.cuda.is_available()
        and torch.cuda.is_initialized()
        and torch.cuda.is_current_stream_capturing()
    )


def _can_arm() -> bool:
    """A timer can stop a step here: SIGALRM exists, this is the main thread (only it runs
    signal handlers), and nothing else handles the signal (a user's own alarm is theirs)."""
    return (
        hasattr(signal, "setitimer")
        and threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, None)
    )


@contextmanager
def _deadline(lines: KillLines | None) -> Iterator[bool]:
    """Raise :class:`_OverTime` inside the block once ``lines``' time budget ends; yields
    whether a stop is armed (not without a time budget, nor where :func:`_can_arm` says no)."""
    left_s = time_left_s(lines) if lines is not None else None
    if left_s is None or not _can_arm():
        yield False
        return

    def stop(signum: int, frame: Any) -> None:
        if _capturing():
            signal.setitimer(signal.ITIMER_REAL, CAPTURE_RETRY_S)
            return
        raise _OverTime

    previous = signal.signal(signal.SIGALRM, stop)
    try:
        signal.setitimer(signal.ITIMER_REAL, max(left_s, 1e-3))
        yield True
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _reset_compiler() -> None:
    """Drop what a compile stopped halfway left (dynamo may otherwise skip the frame after)."""
    if "torch._dynamo" in sys.modules:
        import torch._dynamo

        torch._dynamo.reset()


def run_step(
    workload: Workload, phase: str, side: str, step: int, lines: KillLines | None = None
) -> torch.Tensor | float | None:
    """One step of one side; an exception from the user's step becomes a step_error kill.
    With ``lines``, the step is stopped where its time budget ends inside it (a time_budget
    kill; see the module docstring)."""
    try:
        with _deadline(lines):
            value = workload.step()
    except _OverTime:
        _reset_compiler()
        assert lines is not None and lines.time_budget_s is not None
        raise over_time(lines, phase, side, step) from None
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
