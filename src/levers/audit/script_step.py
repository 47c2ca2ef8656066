"""Whether a capture is of a script run after ``levers audit --`` (one step of a running loop).

A factory's step is one function called again and again; a script's captured step is one
iteration of a loop that may differ from step to step (a log line every N steps) and that no
workload spec builds again. Claims and commands that depend on that read it here.
"""

from __future__ import annotations

from levers.capture.records import Capture


def script_command(capture: Capture) -> str | None:
    """The ``python train.py ...`` a script capture ran (after ``levers audit --``), else None."""
    command = capture.workload_params.get("command")
    return command if isinstance(command, str) and command.startswith("python") else None
