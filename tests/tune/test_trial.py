"""One trial's judgement (levers.tune.trial.judge) and its saving, as ab judges a comparison."""

from __future__ import annotations

import pytest

from levers.tune.trial import Trial, judge


def _trial(**fields) -> Trial:
    base = dict(base=(), stack=("raise-batch",), decision="IMPROVED", tokens_per_s_ratio=1.25,
                tokens_per_s_ci95=(1.2, 1.3), step_time_ratio=6.4, step_time_ci95=(6.3, 6.5),
                step_ms=(10.0, 64.0), parity="DAMAGED", parity_note="grad_norm differs")
    return Trial(**{**base, **fields})


def test_sides_of_different_tokens_per_step_are_judged_per_token_not_on_one_step_parity():
    pays, why = judge(_trial(tokens_differ=True))
    assert pays and why.startswith("pays: tokens/s 1.250x")


def test_the_same_trial_with_the_same_tokens_per_step_fails_on_parity():
    pays, why = judge(_trial(tokens_differ=False))
    assert not pays and why.startswith("failed parity")


def test_quality_still_counts_when_tokens_differ():
    pays, why = judge(_trial(tokens_differ=True, quality="DAMAGED", quality_note="loss +0.2"))
    assert not pays and "quality dropped" in why


def test_the_saving_of_a_larger_batch_is_the_baselines_step_at_the_new_tokens_per_s():
    assert _trial(tokens_differ=True).saved_ms == pytest.approx(10.0 * (1 - 1 / 1.25))
    assert _trial(tokens_differ=False).saved_ms == pytest.approx(10.0 - 64.0)
