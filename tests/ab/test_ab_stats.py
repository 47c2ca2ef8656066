"""The bootstrap and summaries against cases with known answers."""

from __future__ import annotations

import math
import random

import pytest

from levers.ab.stats import paired_ratio_ci, quantile, summarize


def test_quantile_interpolates_like_numpy_linear():
    values = [4.0, 1.0, 3.0, 2.0]
    assert quantile(values, 0.0) == 1.0
    assert quantile(values, 1.0) == 4.0
    assert quantile(values, 0.5) == 2.5
    assert quantile(values, 0.1) == pytest.approx(1.3)
    assert quantile([7.0], 0.9) == 7.0


def test_summarize_gives_median_and_deciles():
    s = summarize([float(v) for v in range(1, 12)])  # 1..11
    assert (s.num_samples, s.median, s.p10, s.p90) == (11, 6.0, 2.0, 10.0)


def test_constant_samples_give_a_zero_width_interval():
    ci = paired_ratio_ci([2.0] * 30, [2.0] * 30, num_resamples=1000, seed=3)
    assert (ci.ratio, ci.lo, ci.hi) == (1.0, 1.0, 1.0)


def test_a_constant_ratio_is_recovered_exactly():
    rng = random.Random(0)
    base = [rng.uniform(1.0, 5.0) for _ in range(41)]
    cand = [0.8 * b for b in base]  # every pair has ratio 0.8, so every resample does too
    ci = paired_ratio_ci(base, cand, num_resamples=2000, seed=1)
    assert ci.ratio == pytest.approx(0.8, rel=1e-12)
    assert ci.lo == pytest.approx(0.8, rel=1e-12)
    assert ci.hi == pytest.approx(0.8, rel=1e-12)


def test_pairing_cancels_shared_drift():
    # both sides drift by the same factor: a paired bootstrap of means sees an exact ratio
    drift = [1.0 + 0.5 * i for i in range(50)]
    ci = paired_ratio_ci(drift, [1.1 * d for d in drift], num_resamples=1000, statistic="mean")
    assert ci.lo == pytest.approx(1.1) and ci.hi == pytest.approx(1.1)


def test_large_normal_sample_matches_the_analytic_interval_of_the_mean():
    # baseline constant 1, candidate ~ N(mu, sigma): the ratio of means is the mean of the
    # candidate, whose CI95 is mean +- 1.96 sigma / sqrt(n)
    rng = random.Random(42)
    n, mu, sigma = 4000, 10.0, 1.0
    cand = [rng.gauss(mu, sigma) for _ in range(n)]
    mean = sum(cand) / n
    sd = math.sqrt(sum((c - mean) ** 2 for c in cand) / (n - 1))
    half_width = 1.959964 * sd / math.sqrt(n)
    ci = paired_ratio_ci([1.0] * n, cand, num_resamples=10_000, seed=0, statistic="mean")
    assert ci.ratio == pytest.approx(mean, rel=1e-12)
    assert ci.lo == pytest.approx(mean - half_width, abs=0.1 * half_width)
    assert ci.hi == pytest.approx(mean + half_width, abs=0.1 * half_width)


def test_large_normal_sample_matches_the_asymptotic_interval_of_the_median():
    # the sample median of N(mu, sigma) has standard error sqrt(pi / 2) sigma / sqrt(n)
    rng = random.Random(7)
    n, mu, sigma = 2001, 10.0, 1.0
    cand = [rng.gauss(mu, sigma) for _ in range(n)]
    median = sorted(cand)[n // 2]
    half_width = 1.959964 * math.sqrt(math.pi / 2) * sigma / math.sqrt(n)
    ci = paired_ratio_ci([1.0] * n, cand, num_resamples=10_000, seed=0)
    assert ci.ratio == pytest.approx(median, rel=1e-12)
    assert ci.hi - ci.lo == pytest.approx(2 * half_width, rel=0.2)
    assert ci.lo < median < ci.hi


def test_the_seed_fixes_the_interval():
    rng = random.Random(1)
    base = [rng.uniform(1, 2) for _ in range(30)]
    cand = [rng.uniform(1, 2) for _ in range(30)]
    first = paired_ratio_ci(base, cand, num_resamples=500, seed=11)
    again = paired_ratio_ci(base, cand, num_resamples=500, seed=11)
    other = paired_ratio_ci(base, cand, num_resamples=500, seed=12)
    assert (first.lo, first.hi) == (again.lo, again.hi)
    assert (first.lo, first.hi) != (other.lo, other.hi)
    assert (first.seed, first.num_resamples, first.statistic) == (11, 500, "median")


def test_resampling_in_blocks_gives_the_same_draws(monkeypatch):
    import levers.ab.stats as stats

    rng = random.Random(5)
    base = [rng.uniform(1, 2) for _ in range(20)]
    cand = [rng.uniform(1, 2) for _ in range(20)]
    whole = paired_ratio_ci(base, cand, num_resamples=300, seed=2)
    monkeypatch.setattr(stats, "_BLOCK_ELEMENTS", 20 * 7)  # 7 resamples per block
    blocked = paired_ratio_ci(base, cand, num_resamples=300, seed=2)
    assert blocked.ratio == whole.ratio
    assert blocked.lo == pytest.approx(whole.lo) and blocked.hi == pytest.approx(whole.hi)


@pytest.mark.parametrize(
    "base, cand, kwargs, message",
    [
        ([1.0, 2.0], [1.0], {}, "equal counts"),
        ([1.0], [1.0], {}, "at least 2 pairs"),
        ([1.0, 2.0], [1.0, 2.0], {"num_resamples": 10}, "at least 100"),
        ([1.0, float("nan")], [1.0, 2.0], {}, "finite"),
        ([1.0, 0.0], [1.0, 2.0], {}, "positive"),
        ([1.0, 2.0], [1.0, 2.0], {"statistic": "mode"}, "statistic"),
    ],
)
def test_bad_inputs_are_refused(base, cand, kwargs, message):
    with pytest.raises(ValueError, match=message):
        paired_ratio_ci(base, cand, **kwargs)


def test_the_interval_covers_a_true_ratio_of_one_about_95_percent_of_the_time():
    # simulated A/A runs: two sides with the same noisy step time; the CI95 must contain 1 in
    # roughly 95% of them (fixed seeds: the count is deterministic)
    num_runs, num_covered = 300, 0
    for trial in range(num_runs):
        rng = random.Random(trial)
        base = [1.0 + 0.05 * rng.gauss(0, 1) for _ in range(30)]
        cand = [1.0 + 0.05 * rng.gauss(0, 1) for _ in range(30)]
        ci = paired_ratio_ci(base, cand, num_resamples=1000, seed=trial)
        num_covered += ci.lo <= 1.0 <= ci.hi
    assert 0.92 <= num_covered / num_runs <= 0.98
