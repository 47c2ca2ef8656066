"""A whole comparison on CPU with tiny workloads; timing runs on a fake clock so that every
verdict is deterministic."""

from __future__ import annotations

import pytest
from ab_helpers import side

from levers.ab.runner import AbConfig, run_ab
from levers.ab.verdict import DAMAGED, IMPROVED, NOT_MEASURED, PARITY

FAST = dict(num_steps=20, num_warmup=2, num_parity_steps=3, num_resamples=1000)


def verdicts(result):
    return {r.name: r.verdict for r in result.reads}


def test_a_over_a_is_parity_on_every_read(clock):
    # the same timing on both sides: the ratio is exactly 1 and every read is PARITY
    result = run_ab(
        side(clock=clock, noise=0.05, noise_seed=1),
        side(clock=clock, noise=0.05, noise_seed=1),
        AbConfig(**FAST),
    )
    assert verdicts(result) == {
        "step_time": PARITY,
        "tokens_per_s": PARITY,
        "peak_allocated": NOT_MEASURED,  # CPU
        "peak_reserved": NOT_MEASURED,
        "parity": PARITY,
    }
    assert result.decision == PARITY
    assert result.killed is None
    # identical builds on a CPU compute bitwise-identical steps
    assert all(c.rel_diff == 0.0 for c in result.parity.checks)
    assert [c.quantity for c in result.parity.checks] == [
        "loss",
        "grad_norm",
        "loss",
        "grad_norm",
        "params",
    ]
    assert len(result.samples["baseline"].dur_ms) == 20
    assert len(result.samples["candidate"].losses) == 20


def test_a_over_a_with_independent_noise_is_mostly_parity(clock):
    # a CI95 misses the truth 5% of the time: over ten A/A runs with independent timing noise
    # on each side (fixed seeds, so the count is deterministic) at least eight read PARITY
    num_parity = 0
    for k in range(10):
        result = run_ab(
            side(clock=clock, noise=0.05, noise_seed=2 * k + 1),
            side(clock=clock, noise=0.05, noise_seed=2 * k + 2),
            AbConfig(**FAST),
        )
        assert result.read("parity").verdict == PARITY
        num_parity += result.read("step_time").verdict == PARITY
    assert num_parity >= 8


def test_a_faster_candidate_is_improved(clock):
    result = run_ab(
        side(clock=clock, step_ms=1.0), side(clock=clock, step_ms=0.8), AbConfig(**FAST)
    )
    step_time = result.read("step_time")
    assert step_time.verdict == IMPROVED
    assert step_time.ci.ratio == pytest.approx(0.8)
    assert result.read("tokens_per_s").verdict == IMPROVED
    assert result.read("tokens_per_s").ci.ratio == pytest.approx(1.25)
    assert step_time.baseline.median == pytest.approx(1.0)
    assert result.decision == IMPROVED


@pytest.mark.parametrize("wrong_fix", ["scaled_loss", "no_residual"])
def test_a_wrong_fix_is_damaged_however_fast(clock, wrong_fix):
    result = run_ab(
        side(clock=clock, step_ms=1.0),
        side(clock=clock, step_ms=0.5, fixed=wrong_fix),
        AbConfig(**FAST),
    )
    assert result.read("step_time").verdict == IMPROVED
    assert result.read("parity").verdict == DAMAGED
    assert result.decision == DAMAGED
    assert result.parity.passed is False
    first_loss = result.parity.checks[0]
    assert (first_loss.step, first_loss.quantity, first_loss.passed) == (1, "loss", False)
    if wrong_fix == "scaled_loss":  # |2L - L| / 2L
        assert first_loss.rel_diff == pytest.approx(0.5)
        assert first_loss.candidate == pytest.approx(2 * first_loss.baseline)
    assert "loss after step 1 differs from the float64 run by" in result.read("parity").note


def test_a_correct_rewrite_passes_parity_as_numerics_changing(clock):
    result = run_ab(side(clock=clock), side(clock=clock, fixed="rewrite"), AbConfig(**FAST))
    assert result.parity.passed is True
    assert result.read("parity").verdict == PARITY
    assert max(c.rel_diff for c in result.parity.checks) < 1e-5


def test_different_tokens_per_step_are_warned_about(clock):
    result = run_ab(side(clock=clock), side(clock=clock, tokens_per_step=16), AbConfig(**FAST))
    assert any("tokens per step differ" in w for w in result.warnings)
    assert result.read("tokens_per_s").ci.ratio == pytest.approx(2.0)


def test_the_same_seed_gives_the_same_result(clock):
    first = run_ab(
        side(clock=clock, noise=0.1, noise_seed=3),
        side(clock=clock, noise=0.1, noise_seed=4),
        AbConfig(**FAST),
    )
    clock[0] = 0.0
    again = run_ab(
        side(clock=clock, noise=0.1, noise_seed=3),
        side(clock=clock, noise=0.1, noise_seed=4),
        AbConfig(**FAST),
    )
    assert first.read("step_time").ci == again.read("step_time").ci
    assert first.samples == again.samples


def test_config_refuses_nonsense():
    with pytest.raises(ValueError, match="num_steps must be at least 2"):
        AbConfig(num_steps=1)
    with pytest.raises(ValueError, match="exactness"):
        AbConfig(exactness="roughly")
    with pytest.raises(ValueError, match="mem_gate_gib must be positive"):
        AbConfig(mem_gate_gib=0)
