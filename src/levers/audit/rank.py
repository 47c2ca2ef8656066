"""Rank findings by expected payoff: time saved per step and memory freed at the peak.

    payoff = saved_ms / step_ms + weight * saved_bytes / peak_bytes

Both terms are shares of the step (its time, its peak memory), so a finding that frees a tenth
of the peak ranks with one that saves a twentieth of the step time. The weight of memory follows
the bottleneck: :data:`MEMORY_WEIGHT` when memory binds (or nothing says it does not), 0 when the
step is throughput-bound, since freed memory then buys nothing until it is spent on a larger
batch (which MEM003 prices in time). Ties go to the higher
severity, then to the code and the receipt, so the order is stable.

A finding whose fix is priced and saves nothing worth a figure (under
:data:`NEGLIGIBLE_STEP_SHARE` of the step, no memory freed) is ranked ``low`` whatever its rule's
default: a medium or high beside "saves 0.00 us" would be a claim its own numbers refute.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from levers.audit.finding import Finding, severity_rank

MEMORY_WEIGHT = 0.5
# a saving under this share of the step (and no memory freed) is no saving
NEGLIGIBLE_STEP_SHARE = 1e-3


def saves_nothing(finding: Finding, *, step_ms: float) -> bool:
    """The fix is priced (now and fixed known) and saves no time worth a figure and no memory."""
    cost = finding.cost
    if cost is None or cost.now_ms is None or cost.fixed_ms is None or cost.saved_bytes > 0:
        return False
    return cost.saved_ms <= NEGLIGIBLE_STEP_SHARE * max(step_ms, 0.0)


def cap_severity(findings: Iterable[Finding], *, step_ms: float) -> list[Finding]:
    """Findings whose fix saves nothing are ranked low (see the module docstring)."""
    return [
        dataclasses.replace(f, severity="low")
        if f.severity != "low" and saves_nothing(f, step_ms=step_ms) else f
        for f in findings
    ]


def memory_weight(bound: str) -> float:
    """The weight of freed memory in the payoff, from the bottleneck's bound."""
    return 0.0 if bound == "throughput-bound" else MEMORY_WEIGHT


def payoff(
    finding: Finding, *, step_ms: float, peak_bytes: int, weight: float = MEMORY_WEIGHT
) -> float:
    cost = finding.cost
    if cost is None:
        return 0.0
    time_share = cost.saved_ms / step_ms if step_ms > 0 else 0.0
    memory_share = cost.saved_bytes / peak_bytes if peak_bytes > 0 else 0.0
    return time_share + weight * memory_share


def rank(
    findings: Iterable[Finding],
    *,
    step_ms: float,
    peak_bytes: int,
    weight: float = MEMORY_WEIGHT,
) -> list[Finding]:
    """Findings, highest payoff first; a finding its rule does not recommend goes after the rest."""
    return sorted(
        findings,
        key=lambda f: (
            f.details.get("recommended") is False,
            -round(payoff(f, step_ms=step_ms, peak_bytes=peak_bytes, weight=weight), 12),
            -severity_rank(f.severity),
            f.code,
            f.receipt.file,
            f.receipt.line,
        ),
    )
