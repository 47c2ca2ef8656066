"""Print errors for a person: a one-line message, the user's own traceback when there is one.

A :class:`levers.errors.LeversError` is an expected failure (bad input, a workload that raises)
and prints as ``levers: error: <message>``. Anything else is a defect in levers: it prints a
short message asking for a report, and the full traceback only when asked for (``--debug`` or
``LEVERS_DEBUG=1``).
"""

from __future__ import annotations

import os
import traceback

from rich.console import Console
from rich.text import Text

from levers.errors import LeversError
from levers.output.console import make_console

DEBUG_ENV = "LEVERS_DEBUG"


def debug_from_env() -> bool:
    return os.environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "false", "no")


def _stderr_console() -> Console:
    return make_console(stderr=True, soft_wrap=True)


def print_error(exc: LeversError, console: Console | None = None) -> None:
    """``levers: error: <message>``, then the user's traceback if the error carries one."""
    console = console or _stderr_console()
    line = Text("levers: error: ", style="bold red")
    line.append(str(exc))
    console.print(line, soft_wrap=True)
    if exc.user_traceback:
        console.print(Text(exc.user_traceback.rstrip("\n")), soft_wrap=True)


def print_internal_error(
    exc: BaseException, *, debug: bool, console: Console | None = None
) -> None:
    """A short note for a defect in levers itself; the traceback only under ``debug``."""
    console = console or _stderr_console()
    if debug:
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        console.print(Text(text.rstrip("\n")), soft_wrap=True)
    line = Text("levers: internal error: ", style="bold red")
    line.append(f"{type(exc).__name__}: {exc}")
    console.print(line, soft_wrap=True)
    hint = "This is a bug in levers; please report it with the command you ran"
    if debug:
        hint += " and the traceback above."
    else:
        hint += f" and the traceback that --debug (or {DEBUG_ENV}=1) prints."
    console.print(Text(hint), soft_wrap=True)
