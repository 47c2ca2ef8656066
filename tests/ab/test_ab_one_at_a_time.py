"""An A/B whose sides run one at a time (sides=one-at-a-time): for steps two of which do not fit
the device. Each side is built, checked, warmed up and timed alone, then freed; the verdicts are
those of the sides run together, the record says how they ran."""

from __future__ import annotations

import gc
import weakref

import pytest
from ab_helpers import side
from test_ab_quality import with_eval_hook

from levers.ab.runner import ONE_AT_A_TIME_NOTE, AbConfig, Side, run_ab
from levers.ab.verdict import DAMAGED, IMPROVED, NOT_MEASURED, PARITY

FAST = dict(num_steps=20, num_warmup=2, num_parity_steps=3, num_resamples=1000,
            sides="one-at-a-time")


def verdicts(result):
    return {r.name: r.verdict for r in result.reads}


def test_a_faster_candidate_reads_improved_with_every_side_timed_alone(clock):
    result = run_ab(side(clock=clock, step_ms=1.0), side(clock=clock, step_ms=0.8),
                    AbConfig(**FAST))
    assert verdicts(result) == {"step_time": IMPROVED, "tokens_per_s": IMPROVED,
                                "peak_allocated": NOT_MEASURED, "peak_reserved": NOT_MEASURED,
                                "parity": PARITY}
    assert result.read("step_time").ci.ratio == pytest.approx(0.8)
    assert result.decision == IMPROVED
    assert len(result.samples["baseline"].dur_ms) == len(result.samples["candidate"].dur_ms) == 20
    assert ONE_AT_A_TIME_NOTE in result.warnings
    # the same parity series as the sides run together, with no parameter comparison
    assert [c.quantity for c in result.parity.checks] == ["loss", "grad_norm"] * 2
    assert all(c.rel_diff == 0.0 for c in result.parity.checks)
    assert "parameters not compared: the sides ran one at a time" in result.parity.notes
    assert {"build", "parity", "warmup", "timed"} <= set(result.phase_s)
    together = run_ab(side(clock=clock, step_ms=1.0), side(clock=clock, step_ms=0.8),
                      AbConfig(**{**FAST, "sides": "together"}))
    assert ONE_AT_A_TIME_NOTE not in together.warnings
    assert together.parity.baseline_losses == result.parity.baseline_losses
    assert together.parity.candidate_losses == result.parity.candidate_losses


def _alive_at_each_build(clock, sides):
    """For each build of the A/B (the float64 reference's, the baseline's, the candidate's...):
    how many models built before it were still alive."""
    built, alive = [], []

    def tracked():
        plain = side(clock=clock)

        def build():
            gc.collect()
            alive.append(sum(ref() is not None for ref in built))
            workload = plain.build()
            built.append(weakref.ref(workload.model))
            return workload

        return Side(build, plain.spec, plain.params)

    run_ab(tracked(), tracked(), AbConfig(**{**FAST, "sides": sides}))
    return alive


def test_the_baseline_is_freed_before_the_candidate_is_built(clock):
    # reference, baseline, candidate: one at a time, no model lives when the next is built
    assert _alive_at_each_build(clock, "one-at-a-time") == [0, 0, 0]
    # together, the baseline lives when the candidate is built (the check can tell)
    assert _alive_at_each_build(clock, "together") == [0, 0, 1]


def test_a_wrong_fix_is_damaged_one_at_a_time_too(clock):
    result = run_ab(side(clock=clock, step_ms=1.0),
                    side(clock=clock, step_ms=0.5, fixed="scaled_loss"), AbConfig(**FAST))
    assert result.read("parity").verdict == DAMAGED
    assert result.decision == DAMAGED


def test_a_baseline_that_fails_stops_the_run_before_the_candidate_is_built(clock):
    candidate_built = []
    candidate = side(clock=clock)
    result = run_ab(
        side(clock=clock, raise_at=2),
        Side(lambda: candidate_built.append(1) or candidate.build(), "c", {}),
        AbConfig(**FAST),
    )
    assert result.killed is not None and result.killed.side == "baseline"
    assert result.candidate is None and not candidate_built
    assert result.samples is None


def test_the_quality_read_pairs_held_out_losses_read_before_each_side_is_freed(clock):
    config = AbConfig(**{**FAST, "num_steps": 3, "num_warmup": 1, "num_parity_steps": 1,
                         "num_resamples": 200})
    same = run_ab(with_eval_hook(clock=clock), with_eval_hook(clock=clock), config)
    assert same.quality.verdict == PARITY and same.quality.num_examples == 8
    worse = run_ab(with_eval_hook(clock=clock), with_eval_hook(shift=0.5, clock=clock), config)
    assert worse.quality.verdict == DAMAGED and worse.decision == DAMAGED
    plain = run_ab(with_eval_hook(clock=clock), side(clock=clock), config)
    assert plain.quality.verdict == NOT_MEASURED
    assert "the candidate workload sets no eval_losses hook" in plain.quality.note


def test_an_unknown_way_of_running_the_sides_is_refused():
    with pytest.raises(ValueError, match="sides must be one of"):
        AbConfig(sides="interleaved")
