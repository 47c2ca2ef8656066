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
import warnings
from collections.abc import Iterator, Sequence

import torch

from levers.api import Step
from levers.audit.report_files import REPORT_FILES, write_reports
from levers.audit.run import AuditedStep
from levers.capture.records import Capture
from levers.capture.step import StepCapture
from levers.errors import EmptyStep
from levers.levers.applicability import with_applicability
from levers.workload import Workload

__all__ = [
    "REPORT_FILES",
    "AuditedStep",
    "CapturedStep",
    "audit_capture",
    "capture_step",
    "write_reports",
]



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
        EmptyStep (a ValueError): the block ran no torch op or call (at the end of the block).

    Warns when the block ran no backward: the audit then sees a forward pass, not a step.
    """
    workload = Workload(
        model=model,
        step=_inline_step,
        optimizer=optimizer,
        tokens_per_step=tokens_per_step,
        name=name,
    )
    step = CapturedStep()
    capture = StepCapture(workload, ran_before=False)  # the block may be the first step
    capture.start()
    try:
        yield step
    except BaseException:
        capture.abort()
        raise
    captured = capture.stop(reason="an inline capture records the one step of its block")
    # an empty block would audit to no finding, as if nothing were wrong with the step
    if not captured.ops and not captured.calls:
        raise EmptyStep(
            "no training step ran inside capture_step: its with block ran no torch op or call; "
            "put one step of your loop inside it (forward, loss.backward(), optimizer.step())"
        )
    if not any(op.phase == "backward" for op in captured.ops):
        warnings.warn(
            "the with block of capture_step ran no backward: the audit sees the forward pass "
            "alone; put loss.backward() and optimizer.step() inside the block to audit a whole "
            "training step",
            stacklevel=3,
        )
    step.capture = with_applicability(captured, workload)


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
    """Run the audit rules on ``capture`` and rank the findings: :meth:`levers.Step.audit` of a
    capture made in the user's own loop (:meth:`levers.Step.from_capture`). There is no workload
    factory to predict the memory from, so MEM001 estimates its headroom from the capture."""
    return Step.from_capture(capture).audit(
        target=target, select=select, ignore=ignore, benchmark=benchmark
    )
