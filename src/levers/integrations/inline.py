"""Capture and audit one step from inside a training loop.

    with levers.capture_step(model, optimizer) as step:
        loss = model(batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    audited = step.audit()          # the findings, ranked (an AuditedStep)
    audited.write("runs/levers")    # audit.md, audit.html, capture.json, trace.json

The block is an ordinary step of the run: levers only observes it, so the parameters after it
are those an uncaptured step gives. The callbacks (:mod:`levers.integrations.transformers`,
:mod:`levers.integrations.lightning`) write the same files.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from levers.capture.records import Capture
from levers.capture.step import StepCapture
from levers.workload import Workload

REPORT_FILES = ("audit.md", "audit.html", "capture.json", "trace.json")


@dataclass(frozen=True)
class AuditedStep:
    """A captured step and its audit: ``result`` (the rules' findings, priced) and ``report``
    (ranked, as the terminal shows it)."""

    capture: Capture
    result: Any  # levers.audit.AuditResult
    report: Any  # levers.audit.report.FindingsReport

    @property
    def findings(self) -> tuple:
        return self.report.findings

    def write(self, directory: str | os.PathLike[str]) -> dict[str, Path]:
        """Write audit.md, audit.html, capture.json (with the findings) and trace.json into
        ``directory`` (created if needed), each atomically; returns name -> path."""
        return write_reports(self, Path(directory))


class CapturedStep:
    """What ``with capture_step(...) as step`` gives: ``step.capture`` after the block."""

    def __init__(self) -> None:
        self.capture: Capture | None = None

    def audit(
        self,
        *,
        target: str | None = None,
        select: Sequence[str] = (),
        ignore: Sequence[str] = (),
        benchmark: bool = True,
    ) -> AuditedStep:
        if self.capture is None:
            raise ValueError("step.audit() is for after the with block: the step is captured there")
        return audit_capture(
            self.capture, target=target, select=select, ignore=ignore, benchmark=benchmark
        )


@contextlib.contextmanager
def capture_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    name: str = "step",
    tokens_per_step: int | None = None,
) -> Iterator[CapturedStep]:
    """Capture the code in the ``with`` block as one training step of ``model``.

    Raises:
        TypeError: model is not an ``nn.Module`` or optimizer not an ``Optimizer``.
    """
    workload = Workload(
        model=model,
        step=_inline_step,
        optimizer=optimizer,
        tokens_per_step=tokens_per_step,
        name=name,
    )
    step = CapturedStep()
    capture = StepCapture(workload)
    capture.start()
    try:
        yield step
    except BaseException:
        capture.abort()
        raise
    step.capture = capture.stop()


def _inline_step() -> None:
    raise RuntimeError("an inline capture's step is the code of its with block")


def audit_capture(
    capture: Capture,
    *,
    target: str | None = None,
    select: Sequence[str] = (),
    ignore: Sequence[str] = (),
    benchmark: bool = True,
) -> AuditedStep:
    """Run the audit rules on ``capture`` and rank the findings."""
    from levers.audit import audit
    from levers.audit.report import build_report

    result = audit(
        capture, target=target, select=list(select), ignore=list(ignore), benchmark=benchmark
    )
    return AuditedStep(capture, result, build_report(capture, result))


def write_reports(audited: AuditedStep, directory: Path) -> dict[str, Path]:
    from levers.audit.render_html import write_html
    from levers.audit.render_json import audit_to_dict
    from levers.audit.render_markdown import findings_markdown
    from levers.audit.render_trace import write_trace
    from levers.capture.json_io import write_capture
    from levers.output.atomic import atomic_write_text

    directory.mkdir(parents=True, exist_ok=True)
    paths = {name: directory / name for name in REPORT_FILES}
    config = audited.result.config
    atomic_write_text(paths["audit.md"], findings_markdown(audited.report))
    write_html(audited.capture, audited.report, paths["audit.html"], config=config)
    write_capture(
        audited.capture,
        paths["capture.json"],
        extra={"audit": audit_to_dict(audited.report, config=config)},
    )
    write_trace(audited.capture, paths["trace.json"])
    return paths
