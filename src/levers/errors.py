"""Errors that reach the user: each says what went wrong and what to do next.

The CLI turns a :class:`LeversError` into its message and a non-zero exit code; it never shows
a traceback from inside levers. Where the user's own code raised, ``user_traceback`` holds the
frames from the user's code so the CLI can show them.
"""

from __future__ import annotations

import traceback

from levers.user_code import is_user_file


class LeversError(Exception):
    """An error caused by the input, with a message that says what to do."""

    exit_code = 2

    def __init__(self, message: str, *, user_traceback: str | None = None) -> None:
        super().__init__(message)
        self.user_traceback = user_traceback


class WorkloadNotFound(LeversError):
    """The workload spec names no built-in, file or module that exists."""


class FactoryError(LeversError):
    """The factory is not callable, rejects its parameters, raises, or returns no Workload."""


class StepError(LeversError):
    """The workload's step raised."""

    exit_code = 3


class EmptyStep(LeversError, ValueError):
    """The captured step ran no torch op: there is nothing to audit."""


class MissingDependency(LeversError):
    """An optional dependency is not installed."""


def user_traceback(exc: BaseException) -> str:
    """The traceback of ``exc`` restricted to the user's frames (not levers', not torch's)."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if is_user_file(f.filename)]
    lines = ["Traceback (most recent call last, your code only):\n"]
    lines += traceback.format_list(frames)
    lines += traceback.format_exception_only(type(exc), exc)
    return "".join(lines)
