"""Interim looks (levers.ab.looks): an A/B that levers tune runs stops its timed steps once the
step-time ratio is decided; a no-op is almost never decided early. Timing runs on the fake clock
(conftest) or on seeded synthetic samples: every count here is deterministic."""

from __future__ import annotations

import pytest
import torch
from ab_helpers import side

from levers.ab import looks
from levers.ab.runner import AbConfig, run_ab
from levers.ab.verdict import IMPROVED, PARITY

FAST = dict(num_steps=40, num_warmup=2, num_parity_steps=3, num_resamples=1000)


@pytest.mark.parametrize(("num_steps", "expected"), [
    (20, (10, 15)), (40, (10, 20, 30)), (100, (25, 50, 75)), (10, ()), (2, ()),
])
def test_the_looks_are_at_quarters_with_enough_pairs(num_steps, expected):
    assert looks.looks(num_steps) == expected


def test_a_clear_difference_stops_at_the_first_look_and_says_so(clock):
    result = run_ab(side(clock=clock, step_ms=1.0, noise=0.05, noise_seed=1),
                    side(clock=clock, step_ms=0.8, noise=0.05, noise_seed=2),
                    AbConfig(**FAST, stop_when_decided=True))
    assert result.decision == IMPROVED
    assert len(result.samples["baseline"].dur_ms) == len(result.samples["candidate"].dur_ms) == 10
    assert result.read("step_time").ci.hi < 1.0
    assert any("stopped after 10 of 40 per side" in w for w in result.warnings)


def test_levers_ab_times_every_step_it_is_asked_for(clock):
    result = run_ab(side(clock=clock, step_ms=1.0, noise=0.05, noise_seed=1),
                    side(clock=clock, step_ms=0.8, noise=0.05, noise_seed=2), AbConfig(**FAST))
    assert len(result.samples["candidate"].dur_ms) == 40
    assert not any("stopped after" in w for w in result.warnings)


def test_a_no_op_runs_every_step(clock):
    # the same timing on both sides, jitter independent: nothing to decide early
    result = run_ab(side(clock=clock, step_ms=1.0, noise=0.05, noise_seed=3),
                    side(clock=clock, step_ms=1.0, noise=0.05, noise_seed=4),
                    AbConfig(**FAST, stop_when_decided=True))
    assert len(result.samples["candidate"].dur_ms) == 40
    assert result.read("step_time").verdict == PARITY


def _draw(n: int, seed: int, gain: float = 1.0) -> dict[str, list[float]]:
    g = torch.Generator().manual_seed(seed)
    # log-normal jitter of 10%, and now and then a slow step (a host hiccup), as GPU steps have
    base = torch.exp(0.1 * torch.randn(n, generator=g, dtype=torch.float64))
    cand = torch.exp(0.1 * torch.randn(n, generator=g, dtype=torch.float64)) / gain
    base[torch.rand(n, generator=g) < 0.05] *= 3
    cand[torch.rand(n, generator=g) < 0.05] *= 3
    return {"baseline": base.tolist(), "candidate": cand.tolist()}


def test_a_no_op_is_decided_at_a_look_in_far_fewer_than_one_in_a_hundred_draws():
    # 300 seeded no-op A/Bs of 100 steps, looked at after 25, 50 and 75 pairs: each look's
    # 99.9% interval excludes 1 by chance about once in a thousand
    early = 0
    for seed in range(300):
        durations = _draw(100, seed)
        early += any(looks.decided({k: v[:n] for k, v in durations.items()}, seed=seed)
                     for n in looks.looks(100))
    assert early <= 3


def test_a_real_gain_is_decided_early_in_most_draws():
    # a 15% faster candidate under 10% jitter is decided at the first or second look
    decided = sum(
        any(looks.decided({k: v[:n] for k, v in _draw(100, seed, 1.15).items()}, seed=seed)
            for n in looks.looks(100)[:2])
        for seed in range(40)
    )
    assert decided >= 36


def test_too_few_pairs_decide_nothing():
    assert not looks.decided({"baseline": [2.0] * 5, "candidate": [1.0] * 5})


def _one_at_a_time(clock, baseline_noise: float = 0.05, candidate_ms: float = 0.8,
                   candidate_noise: float = 0.05, seeds: tuple[int, int] = (1, 2),
                   stop_when_decided: bool = True):
    """An A/B of sides one at a time on the fake clock: a baseline of 1 ms steps against a
    candidate of ``candidate_ms``, each with its jitter."""
    return run_ab(side(clock=clock, step_ms=1.0, noise=baseline_noise, noise_seed=seeds[0]),
                  side(clock=clock, step_ms=candidate_ms, noise=candidate_noise,
                       noise_seed=seeds[1]),
                  AbConfig(**FAST, stop_when_decided=stop_when_decided, sides="one-at-a-time"))


def test_sides_one_at_a_time_stop_the_candidate_s_steps_at_a_look_against_the_baseline_s(clock):
    # the baseline is timed first, all its steps where they jitter (nothing to compare them with
    # yet); the candidate's are looked at against as many of the baseline's, and stop once
    # decided
    result = _one_at_a_time(clock)
    assert result.decision == IMPROVED
    assert len(result.samples["baseline"].dur_ms) == 40
    assert len(result.samples["candidate"].dur_ms) == 10
    assert result.read("step_time").ci.hi < 1.0
    assert any(w.startswith("the candidate's timed steps stopped after 10 of 40: ") and
               w.endswith("the reads pair them with the baseline's first 10")
               for w in result.warnings)


def test_sides_one_at_a_time_time_every_candidate_step_of_a_no_op_or_of_levers_ab(clock):
    no_op = _one_at_a_time(clock, candidate_ms=1.0, seeds=(3, 4))
    assert len(no_op.samples["candidate"].dur_ms) == 40
    asked = _one_at_a_time(clock, stop_when_decided=False)
    assert len(asked.samples["candidate"].dur_ms) == 40


def test_a_baseline_timed_alone_stops_where_its_median_is_settled(clock):
    # sides one at a time: a steady baseline (0.1% jitter) is settled at the first look, and the
    # candidate is timed as many steps at most (glm_moe_dsa's eager baseline, H100 s52: 20
    # steps of 1.2 s timed where 10 were paired)
    result = _one_at_a_time(clock, baseline_noise=0.001)
    assert result.decision == IMPROVED
    assert len(result.samples["baseline"].dur_ms) == 10
    assert len(result.samples["candidate"].dur_ms) == 10
    assert any(w.startswith("the baseline's timed steps stopped after 10 of 40: their median "
                            "was settled there") for w in result.warnings)


def test_a_jittery_baseline_or_levers_ab_times_every_baseline_step(clock):
    jittery = _one_at_a_time(clock)
    assert len(jittery.samples["baseline"].dur_ms) == 40
    asked = _one_at_a_time(clock, baseline_noise=0.001, candidate_noise=0.001,
                           stop_when_decided=False)
    assert len(asked.samples["baseline"].dur_ms) == len(asked.samples["candidate"].dur_ms) == 40


def test_settled_reads_the_spread_of_one_side_s_steps():
    g = torch.Generator().manual_seed(0)
    steady = (1000 * torch.exp(0.0015 * torch.randn(10, generator=g, dtype=torch.float64))).tolist()
    jittery = (1000 * torch.exp(0.03 * torch.randn(10, generator=g, dtype=torch.float64))).tolist()
    assert looks.settled(steady) and not looks.settled(jittery)
    assert not looks.settled(steady[:looks.MIN_LOOK_PAIRS - 1])
