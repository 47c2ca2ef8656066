"""Each pre-registered expectation, marked met or missed against a result."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from levers.ab.prereg import Expectation
from levers.ab.runner import AbResult
from levers.ab.verdict import expectation_met


@dataclass(frozen=True)
class Outcome:
    expectation: Expectation
    met: bool | None  # None: its read was not measured
    evidence: str


def _evidence(result: AbResult, exp: Expectation) -> str:
    read = result.read(exp.read)
    if read.ci is not None:
        return f"ratio {read.ci.ratio:.4f}, CI95 [{read.ci.lo:.4f}, {read.ci.hi:.4f}]"
    return f"{read.verdict}: {read.note}" if read.note else read.verdict


def evaluate(expectations: Sequence[Expectation], result: AbResult) -> tuple[Outcome, ...]:
    parity_passed = result.parity.passed if result.parity is not None else None
    return tuple(
        Outcome(
            expectation=exp,
            met=expectation_met(
                exp.read, exp.direction, exp.size, result.read(exp.read).ci, parity_passed
            ),
            evidence=_evidence(result, exp),
        )
        for exp in expectations
    )
