"""A status line on stderr while a workload loads and its step is captured.

Shown only when stderr is a terminal, so logs and pipes stay clean. The capture calls the
callback with the number of ops recorded so far and the current phase, at most every ~0.2 s.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from levers.output.console import make_console


@dataclass
class Progress:
    """``say(message)`` for a stage; ``on_ops(num_ops, phase)`` is the capture's callback."""

    say: Callable[[str], None]
    on_ops: Callable[[int, str], None]


def _ignore(*_args: object) -> None:
    pass


@contextmanager
def progress_status(enabled: bool | None = None) -> Iterator[Progress]:
    """Yield a :class:`Progress`; a no-op one when ``enabled`` is false or stderr is no terminal."""
    if enabled is None:
        enabled = sys.stderr.isatty()
    if not enabled:
        yield Progress(say=_ignore, on_ops=_ignore)
        return
    console = make_console(stderr=True)
    with console.status("starting") as status:
        stage = ["capturing"]

        def say(message: str) -> None:
            stage[0] = message
            status.update(message)

        def on_ops(num_ops: int, phase: str) -> None:
            status.update(status_text(stage[0], num_ops, phase))

        yield Progress(say=say, on_ops=on_ops)


def status_text(stage: str, num_ops: int, phase: str) -> str:
    """``capturing demo-tiny: backward, 1,204 ops so far``."""
    return f"{stage}: {phase}, {num_ops:,} ops so far"
