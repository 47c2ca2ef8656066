"""Verdicts from intervals, the overall decision, and expectations met or missed."""

from __future__ import annotations

import pytest

from levers.ab.reads import compute_reads
from levers.ab.stats import RatioCI
from levers.ab.timing import SideSamples
from levers.ab.verdict import (
    DAMAGED,
    IMPROVED,
    KILLED,
    NOT_MEASURED,
    PARITY,
    decision,
    expectation_met,
    memory_verdict,
    parity_verdict,
    ratio_verdict,
)


MIB = 2**20


def ci(lo: float, hi: float) -> RatioCI:
    return RatioCI(
        ratio=(lo + hi) / 2,
        lo=lo,
        hi=hi,
        confidence=0.95,
        statistic="median",
        num_resamples=1000,
        seed=0,
    )


@pytest.mark.parametrize(
    "lo, hi, better, expected",
    [
        (0.80, 0.95, "lower", IMPROVED),
        (0.80, 0.95, "higher", DAMAGED),
        (1.02, 1.10, "lower", DAMAGED),
        (1.02, 1.10, "higher", IMPROVED),
        (0.97, 1.03, "lower", PARITY),
        (0.97, 1.03, "higher", PARITY),
        (1.00, 1.00, "lower", PARITY),  # an exact tie spans no change
        (0.90, 1.00, "lower", PARITY),  # touching 1 is not entirely on one side
        (1.00, 1.10, "higher", PARITY),
    ],
)
def test_ratio_verdict(lo, hi, better, expected):
    assert ratio_verdict(ci(lo, hi), better) == expected


def test_ratio_verdict_without_interval_is_not_measured():
    assert ratio_verdict(None, "lower") == NOT_MEASURED


def test_ratio_verdict_refuses_unknown_direction():
    with pytest.raises(ValueError, match="better"):
        ratio_verdict(ci(0.9, 1.1), "sideways")


def test_parity_verdict():
    assert [parity_verdict(p) for p in (True, False, None)] == [PARITY, DAMAGED, NOT_MEASURED]


@pytest.mark.parametrize(
    "verdicts, killed, expected",
    [
        ({"step_time": IMPROVED, "parity": PARITY}, False, IMPROVED),
        ({"step_time": IMPROVED, "parity": DAMAGED}, False, DAMAGED),  # speed never buys parity
        ({"step_time": IMPROVED, "peak_allocated": DAMAGED}, False, DAMAGED),
        ({"step_time": PARITY, "peak_allocated": NOT_MEASURED}, False, PARITY),
        ({"step_time": NOT_MEASURED}, False, NOT_MEASURED),
        ({"step_time": NOT_MEASURED, "parity": PARITY}, True, KILLED),
        ({"step_time": NOT_MEASURED, "parity": DAMAGED}, True, DAMAGED),
    ],
)
def test_decision(verdicts, killed, expected):
    assert decision(verdicts, killed=killed) == expected


@pytest.mark.parametrize(
    "direction, size, lo, hi, expected",
    [
        ("lower", 0.0, 0.90, 0.99, True),
        ("lower", 0.05, 0.90, 0.96, False),  # CI must clear 0.95 entirely
        ("lower", 0.05, 0.90, 0.94, True),
        ("higher", 0.10, 1.11, 1.30, True),
        ("higher", 0.10, 1.09, 1.30, False),
        ("same", 0.02, 0.99, 1.01, True),
        ("same", 0.02, 0.97, 1.01, False),
        ("same", 0.0, 1.0, 1.0, True),
    ],
)
def test_expectation_met_for_ratio_reads(direction, size, lo, hi, expected):
    assert expectation_met("step_time", direction, size, ci(lo, hi), None) is expected


def test_expectation_on_an_unmeasured_read_is_undecided():
    assert expectation_met("peak_allocated", "lower", 0.1, None, True) is None


def test_parity_expectation_follows_the_gate():
    assert expectation_met("parity", "same", 0.0, None, True) is True
    assert expectation_met("parity", "same", 0.0, None, False) is False
    with pytest.raises(ValueError, match="parity read takes direction 'same'"):
        expectation_met("parity", "lower", 0.0, None, True)


def test_expectation_refuses_unknown_read_and_negative_size():
    with pytest.raises(ValueError, match="unknown read"):
        expectation_met("latency", "lower", 0.0, ci(0.9, 0.95), None)
    with pytest.raises(ValueError, match=">= 0"):
        expectation_met("step_time", "lower", -0.1, ci(0.9, 0.95), None)


def test_a_comparison_whose_tokens_per_step_differ_is_judged_per_token():
    # raise-batch: the step is longer, the memory it fills was the point, one-step parity
    # cannot hold; tokens/s is what improved
    from levers.ab.verdict import judged_reads

    verdicts = {
        "step_time": "DAMAGED",
        "tokens_per_s": "IMPROVED",
        "peak_allocated": "DAMAGED",
        "parity": "DAMAGED",
    }
    assert decision(judged_reads(verdicts, tokens_differ=True)) == "IMPROVED"
    assert decision(judged_reads(verdicts, tokens_differ=False)) == "DAMAGED"
    assert decision(judged_reads({**verdicts, "tokens_per_s": "DAMAGED"}, True)) == "DAMAGED"


def _side(peak: int) -> SideSamples:
    return SideSamples(
        dur_ms=(10.0, 10.2, 9.9, 10.1),
        losses=(1.0,) * 4,
        peak_allocated_bytes=(peak,) * 4,
        peak_reserved_bytes=(peak,) * 4,
        resident_bytes_start=0,
        resident_bytes_end=0,
    )


@pytest.mark.parametrize(
    "base, cand, expected",
    [
        # a bf16 weight cache of 5 MiB on a 1.5 GiB peak: the same peak, whichever way
        (1536 * MIB, 1541 * MIB, PARITY),
        (1536 * MIB, 1531 * MIB, PARITY),
        # 2% more or less is a change the memory budget sees
        (1000 * MIB, 1020 * MIB, DAMAGED),
        (1000 * MIB, 980 * MIB, IMPROVED),
    ],
)
def test_a_peak_that_moves_by_under_one_percent_is_the_same_peak(base, cand, expected):
    samples = {"baseline": _side(base), "candidate": _side(cand)}
    reads = compute_reads(
        samples, {"baseline": 8, "candidate": 8}, None, num_resamples=200, seed=0
    )
    peak = next(r for r in reads if r.name == "peak_allocated")
    assert peak.verdict == expected
    if expected == PARITY:
        assert f"{(cand - base) / MIB:+.1f} MiB, within 1%" in peak.note
    assert memory_verdict(ci(0.995, 1.005)) == PARITY
    assert memory_verdict(ci(0.995, 1.02)) == PARITY  # holds 1: PARITY as any read
