"""From timed samples to reads: per-side summaries, the ratio CI and the verdict of each read.

Only complete pairs enter a ratio (a run killed between the baseline's and the candidate's k-th
step drops the baseline's k-th sample from the ratio, not from the record).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Sequence

from levers.ab.parity import (
    REFERENCE_MARGIN,
    RULE_MIXED,
    RULE_REFERENCE,
    ParityCheck,
    ParityResult,
)
from levers.ab.stats import RatioCI, Summary, paired_ratio_ci, summarize
from levers.ab.timing import SideSamples
from levers.ab.verdict import (
    MEMORY_SAME_WITHIN,
    NOT_MEASURED,
    PARITY,
    memory_verdict,
    parity_verdict,
    ratio_verdict,
)

# read -> unit of its summaries; peak_reserved is shown but never judged (shared pool)
UNITS = {
    "step_time": "ms",
    "tokens_per_s": "tokens/s",
    "peak_allocated": "bytes",
    "peak_reserved": "bytes",
    "parity": "",
}


@dataclass(frozen=True)
class Read:
    """One read: both sides' summaries, the candidate/baseline ratio CI and its verdict."""

    name: str  # a key of UNITS
    unit: str
    better: str | None  # "lower", "higher", or None for reads that are not ratios
    baseline: Summary | None
    candidate: Summary | None
    ci: RatioCI | None
    verdict: str
    note: str = ""


def _ratio_read(
    name: str,
    better: str,
    base: Sequence[float] | None,
    cand: Sequence[float] | None,
    *,
    num_resamples: int,
    seed: int,
    confidence: float,
    missing: str,
) -> Read:
    if not base or not cand:
        return Read(name, UNITS[name], better, None, None, None, NOT_MEASURED, missing)
    num_pairs = min(len(base), len(cand))
    note = ""
    ci: RatioCI | None = None
    if num_pairs >= 2:
        ci = paired_ratio_ci(
            base[:num_pairs],
            cand[:num_pairs],
            num_resamples=num_resamples,
            seed=seed,
            confidence=confidence,
        )
    else:
        note = f"only {num_pairs} complete pair(s); no confidence interval"
    verdict = ratio_verdict(ci, better)
    if name == "peak_allocated":
        verdict = memory_verdict(ci)
        if ci is not None and verdict == PARITY and ratio_verdict(ci, better) != PARITY:
            moved = statistics.median(cand[:num_pairs]) - statistics.median(base[:num_pairs])
            note = (
                f"{moved / 2**20:+.1f} MiB, within {MEMORY_SAME_WITHIN:.0%} of the baseline's "
                "peak: read as the same peak"
            )
    return Read(name, UNITS[name], better, summarize(base), summarize(cand), ci, verdict, note)


def _tolerance_words(parity: ParityResult) -> str:
    tol = parity.tolerance
    precision = (
        f"{tol.autocast} autocast"
        if tol.autocast
        else "low-precision weights"
        if tol.low_precision
        else "fp32"
    )
    floor = f", {tol.floor_of}'s floor {tol.floor:g}" if tol.floor is not None else ""
    return f"{tol.exactness}, {precision}{floor}"


def _rule_words(parity: ParityResult) -> str:
    """Which rule judged, in words: the verdict never hides that the fixed tolerance did."""
    if parity.rule == RULE_REFERENCE:
        return f"against a float64 run, {_tolerance_words(parity)}"
    if parity.rule == RULE_MIXED:
        return (
            f"against a float64 run where it had a value, else the fixed tolerance, "
            f"{_tolerance_words(parity)}: {parity.tolerance_reason}"
        )
    why = f": {parity.tolerance_reason}" if parity.tolerance_reason else ""
    return f"fixed tolerance, {_tolerance_words(parity)}{why}"


def _allowed_words(check: ParityCheck) -> str:
    return (
        f"allowed {check.allowed_error:.3g} = {REFERENCE_MARGIN:g} x the baseline's "
        f"{check.baseline_error:.3g} + {check.rtol:g}"
    )


def _failed_words(check: ParityCheck, parity: ParityResult) -> str:
    if check.rule == RULE_REFERENCE:
        return (
            f"{check.quantity} after step {check.step} differs from the float64 run by "
            f"{check.candidate_error:.3g} ({_allowed_words(check)}; {_rule_words(parity)})"
        )
    return (
        f"{check.quantity} after step {check.step} differs by {check.rel_diff:.3g} "
        f"(tolerance {check.rtol:g}, {_rule_words(parity)})"
    )


def _passed_words(parity: ParityResult) -> str:
    compared = [c for c in parity.checks if c.gating and c.passed is not None]
    by_reference = [c for c in compared if c.rule == RULE_REFERENCE]
    if by_reference:
        # the check closest to failing, as a share of what it was allowed
        worst = max(by_reference, key=lambda c: c.candidate_error / max(c.allowed_error, 1e-300))
        return (
            f"{parity.num_steps} step(s); the candidate is at most {worst.candidate_error:.3g} "
            f"from the float64 run ({worst.quantity} after step {worst.step}: "
            f"{_allowed_words(worst)}; {_rule_words(parity)})"
        )
    largest = max(c.rel_diff for c in compared if c.rel_diff is not None)
    return (
        f"{parity.num_steps} step(s); largest relative difference {largest:.3g} "
        f"(tolerance {parity.tolerance.rtol_last:g}, {_rule_words(parity)})"
    )


def parity_read(parity: ParityResult | None) -> Read:
    if parity is None:
        return Read("parity", "", None, None, None, None, NOT_MEASURED, "parity gate not run")
    failed = [c for c in parity.checks if c.gating and c.passed is False]
    if failed:
        # The first failure in step order (checks are kept in that order), not the largest:
        # the earliest divergence is where to look, and which difference is "largest" can hang
        # on how float32 rounding breaks a tie between two checks that differ alike.
        more = len(failed) - 1
        note = _failed_words(failed[0], parity) + (
            f"; {more} more check{'s' if more > 1 else ''} failed" if more else ""
        )
    elif parity.passed:
        note = _passed_words(parity)
    else:
        note = "; ".join(parity.notes) or "nothing could be compared"
    if parity.repeat:
        note += f"; {parity.repeat}"
    return Read("parity", "", None, None, None, None, parity_verdict(parity.passed), note)


def compute_reads(
    samples: dict[str, SideSamples] | None,
    tokens_per_step: dict[str, int | None],
    parity: ParityResult | None,
    *,
    num_resamples: int,
    seed: int,
    confidence: float = 0.95,
) -> tuple[Read, ...]:
    kw = {"num_resamples": num_resamples, "seed": seed, "confidence": confidence}
    base = samples.get("baseline") if samples else None
    cand = samples.get("candidate") if samples else None
    not_timed = "not timed (the run stopped before the timed steps)"
    reads = [
        _ratio_read(
            "step_time",
            "lower",
            base and base.dur_ms,
            cand and cand.dur_ms,
            missing=not_timed,
            **kw,
        )
    ]
    tokens_a, tokens_b = tokens_per_step.get("baseline"), tokens_per_step.get("candidate")
    if tokens_a and tokens_b and base and cand:
        rate_a = [tokens_a / (d / 1e3) for d in base.dur_ms]
        rate_b = [tokens_b / (d / 1e3) for d in cand.dur_ms]
        reads.append(_ratio_read("tokens_per_s", "higher", rate_a, rate_b, missing="", **kw))
    else:
        missing = not_timed if not (base and cand) else "the workload sets no tokens_per_step"
        reads.append(
            Read(
                "tokens_per_s",
                UNITS["tokens_per_s"],
                "higher",
                None,
                None,
                None,
                NOT_MEASURED,
                missing,
            )
        )
    if base and cand and base.peak_allocated_bytes is None:
        no_memory = "not measured on a CPU (no caching allocator to read)"
    else:
        no_memory = not_timed
    reads.append(
        _ratio_read(
            "peak_allocated",
            "lower",
            base and base.peak_allocated_bytes,
            cand and cand.peak_allocated_bytes,
            missing=no_memory,
            **kw,
        )
    )
    reserved_a = base and base.peak_reserved_bytes
    reserved_b = cand and cand.peak_reserved_bytes
    reads.append(
        Read(
            "peak_reserved",
            UNITS["peak_reserved"],
            None,
            summarize(reserved_a) if reserved_a else None,
            summarize(reserved_b) if reserved_b else None,
            None,
            NOT_MEASURED,
            "the allocator pool is shared by both sides: shown, not judged"
            if reserved_a
            else no_memory,
        )
    )
    reads.append(parity_read(parity))
    return tuple(reads)
