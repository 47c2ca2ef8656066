"""The console every verb prints through."""

from __future__ import annotations

import os
import sys
from typing import Any

from rich.console import Console


def make_console(*, stderr: bool = False, **kwargs: Any) -> Console:
    """A console that keeps tables readable when output goes to a file or a pipe."""
    stream_is_tty = (sys.stderr if stderr else sys.stdout).isatty()
    width = None if stream_is_tty or os.environ.get("COLUMNS") else 120
    return Console(stderr=stderr, width=width, highlight=False, **kwargs)
