"""The console every verb prints through, and the one way a verb says that it wrote a file.

A verb's report goes to stdout; what is about the run rather than the step (progress, warnings,
"wrote FILE") goes to stderr, so that ``levers VERB ... > report.txt`` keeps only the report.
"""

from __future__ import annotations

import os
import sys
from os import PathLike
from typing import Any

from rich.console import Console


class _Console(Console):
    """rich's console, except that a closed pipe is a ``BrokenPipeError``.

    rich's own answer to a closed pipe is ``SystemExit(1)``, which levers cannot tell from a
    workload's ``sys.exit(1)``; the command line ends quietly on a ``BrokenPipeError``
    (``levers list | head -1``), as other command-line tools do.
    """

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError("the reader of levers' output went away")


def make_console(*, stderr: bool = False, **kwargs: Any) -> Console:
    """A console that keeps tables readable when output goes to a file or a pipe."""
    stream_is_tty = (sys.stderr if stderr else sys.stdout).isatty()
    width = None if stream_is_tty or os.environ.get("COLUMNS") else 120
    return _Console(stderr=stderr, width=width, highlight=False, **kwargs)


def say_wrote(path: str | PathLike[str], what: str | None = None) -> None:
    """Print ``wrote WHAT to PATH`` (or ``wrote PATH``) on stderr."""
    text = f"wrote {what} to {path}" if what else f"wrote {path}"
    make_console(stderr=True).print(text, markup=False, soft_wrap=True)


def silence_stdout() -> None:
    """Point standard output at the null device: the reader has gone (``levers ... | head``),
    and the interpreter's last flush of what is still buffered must not fail on it."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    finally:
        os.close(devnull)
