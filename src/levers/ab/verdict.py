"""Verdicts: what a read's confidence interval says, and whether an expectation was met.

A read is a candidate/baseline ratio with a CI95. The verdict only looks at where the interval
lies relative to 1 (no change): IMPROVED if it lies entirely on the good side, DAMAGED if it lies
entirely on the bad side, PARITY if it contains 1. The parity read is the parity gate: PARITY if
the candidate passed it, DAMAGED if it did not. A read that was not measured (memory on a CPU, a
run killed before timing) is NOT_MEASURED, never PARITY.
"""

from __future__ import annotations

from levers.ab.stats import RatioCI

IMPROVED = "IMPROVED"
PARITY = "PARITY"
DAMAGED = "DAMAGED"
NOT_MEASURED = "N/A"
KILLED = "KILLED"

# read -> which way is better for the ratio candidate/baseline; "parity" is the gate
READS = {
    "step_time": "lower",
    "tokens_per_s": "higher",
    "peak_allocated": "lower",
    "parity": None,
}

DIRECTIONS = ("lower", "higher", "same")


def ratio_verdict(ci: RatioCI | None, better: str) -> str:
    """IMPROVED / PARITY / DAMAGED from where the CI lies relative to a ratio of 1."""
    if better not in ("lower", "higher"):
        raise ValueError(f"better must be 'lower' or 'higher', got {better!r}")
    if ci is None:
        return NOT_MEASURED
    if ci.hi < 1.0:
        return IMPROVED if better == "lower" else DAMAGED
    if ci.lo > 1.0:
        return IMPROVED if better == "higher" else DAMAGED
    return PARITY


# a peak allocated that moves by less than this fraction of the baseline's reads PARITY: the
# allocator's peak is the same number every step, so its CI is a point and any byte would decide
# it (autocast-bf16 on fp32 BatchNorm convnets at batch 64 on an H100 added its 5 MiB bf16 weight
# cache to a 1.5 GiB peak, 0.35%, and read DAMAGED; bench/results/tune_sweep_h100)
MEMORY_SAME_WITHIN = 0.01


def memory_verdict(ci: RatioCI | None) -> str:
    """:func:`ratio_verdict` for a peak memory read (lower is better), with a CI that lies
    within :data:`MEMORY_SAME_WITHIN` of 1 read as PARITY."""
    if ci is not None and 1.0 - MEMORY_SAME_WITHIN < ci.lo and ci.hi < 1.0 + MEMORY_SAME_WITHIN:
        return PARITY
    return ratio_verdict(ci, "lower")


def parity_verdict(passed: bool | None) -> str:
    if passed is None:
        return NOT_MEASURED
    return PARITY if passed else DAMAGED


def decision(verdicts: dict[str, str], killed: bool = False) -> str:
    """One word for the whole comparison, conservative by design.

    DAMAGED if any read is DAMAGED (a candidate that fails parity is damaged whatever its
    speed); else KILLED if a kill line stopped the run; else IMPROVED if any read improved,
    else PARITY. Reads that were not measured do not count; if none was measured the
    decision is NOT_MEASURED.
    """
    measured = [v for v in verdicts.values() if v != NOT_MEASURED]
    if DAMAGED in measured:
        return DAMAGED
    if killed:
        return KILLED
    if not measured:
        return NOT_MEASURED
    if IMPROVED in measured:
        return IMPROVED
    return PARITY


# what a comparison whose tokens per step differ (raise-batch) is judged on: the work per token.
# Its step time, peak memory and one-step parity differ by design (another batch is another
# step, and the memory it fills was the point); they are shown, and the kill lines (--mem-gate)
# hold its memory to the budget
PER_TOKEN_READS = ("tokens_per_s", "quality")


def judged_reads(verdicts: dict[str, str], tokens_differ: bool) -> dict[str, str]:
    """The verdicts the decision reads: all of them, or the per-token ones when the two sides
    do not process the same tokens per step."""
    if not tokens_differ:
        return dict(verdicts)
    return {name: v for name, v in verdicts.items() if name in PER_TOKEN_READS}


def expectation_met(
    read: str, direction: str, size: float, ci: RatioCI | None, parity_passed: bool | None
) -> bool | None:
    """Whether a pre-registered expectation holds; None when its read was not measured.

    ``size`` is a relative change: for "lower" the whole CI must lie below ``1 - size``; for
    "higher" above ``1 + size``; for "same" inside ``[1 - size, 1 + size]``. The parity read
    only takes direction "same", met when the gate passed.
    """
    if read not in READS:
        raise ValueError(f"unknown read {read!r}; use one of {sorted(READS)}")
    if direction not in DIRECTIONS:
        raise ValueError(f"unknown direction {direction!r}; use one of {DIRECTIONS}")
    if size < 0:
        raise ValueError(f"size is a relative change and must be >= 0, got {size}")
    if read == "parity":
        if direction != "same":
            raise ValueError("the parity read takes direction 'same' (the gate passes)")
        return parity_passed
    if ci is None:
        return None
    if direction == "lower":
        return ci.hi < 1.0 - size
    if direction == "higher":
        return ci.lo > 1.0 + size
    return ci.lo >= 1.0 - size and ci.hi <= 1.0 + size


def difference_verdict(lo: float | None, hi: float | None, better: str) -> str:
    """IMPROVED / PARITY / DAMAGED from where a CI of candidate - baseline lies relative to 0.

    The same rule as :func:`ratio_verdict`, for differences: a CI that contains 0 (a point CI at
    0 included) is PARITY.
    """
    if better not in ("lower", "higher"):
        raise ValueError(f"better must be 'lower' or 'higher', got {better!r}")
    if lo is None or hi is None:
        return NOT_MEASURED
    if hi < 0.0:
        return IMPROVED if better == "lower" else DAMAGED
    if lo > 0.0:
        return IMPROVED if better == "higher" else DAMAGED
    return PARITY
