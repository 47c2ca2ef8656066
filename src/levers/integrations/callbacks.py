"""What the Trainer and Lightning callbacks share: capture step N of a run, audit it, write the
report files into the run's output directory (``<output_dir>/levers/``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

from levers.capture.records import Capture
from levers.integrations.steps import StepWatcher
from levers.integrations.inline import audit_capture, write_reports

DEFAULT_STEP = 3
REPORT_DIRNAME = "levers"


class StepAuditor:
    """Captures optimizer step ``step`` (1-based: the step that ends in the ``step``-th
    ``optimizer.step()``) and writes its audit once the run has passed it."""

    def __init__(self, *, step: int, target: str | None, name: str) -> None:
        if not isinstance(step, int) or step < 2:
            raise ValueError(
                f"step must be an int >= 2 (a capture starts at the previous optimizer step), "
                f"got {step!r}"
            )
        self.step = step
        self.target = target
        self.name = name
        self.watcher: StepWatcher | None = None
        self.written: dict[str, Path] | None = None
        self.audited: Any = None

    def begin(self, model: torch.nn.Module | None) -> None:
        self.end()
        self.watcher = StepWatcher(warmup=self.step - 1, name=self.name, model=model)
        self.watcher.install()

    def after_step(self, output_dir: str | Path | None) -> None:
        """Called after each optimizer step: writes the report once the capture is done."""
        watcher = self.watcher
        if watcher is None or watcher.capture is None or self.written is not None:
            return
        self.end()
        self._write(watcher.capture, output_dir)

    def _write(self, capture: Capture, output_dir: str | Path | None) -> None:
        self.audited = audit_capture(capture, target=self.target)
        directory = Path(output_dir or ".") / REPORT_DIRNAME
        self.written = write_reports(self.audited, directory)
        print(
            f"levers: audited step {self.step}: {len(self.audited.findings)} finding(s); "
            f"report in {directory}",
            file=sys.stderr,
        )

    def end(self, output_dir: str | Path | None = None) -> None:
        """Stop watching. A run that ended right after the recorded step, before the step the
        capture times, has a one-pass capture then: its report is written to ``output_dir``."""
        if self.watcher is not None:
            self.watcher.remove()
            if self.watcher.capture is None:
                self.watcher = None
            elif output_dir is not None and self.written is None:
                self._write(self.watcher.capture, output_dir)
