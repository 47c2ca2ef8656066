"""Summary statistics and the seeded paired bootstrap behind every ab read.

The samples of a read are paired: pair ``i`` is the baseline's i-th timed step and the
candidate's i-th timed step, taken next to each other in time. The bootstrap resamples pair
indices (the same indices for both sides), so slow drift of the machine (clocks, thermals,
other processes) moves both sides of a resample together instead of widening the interval.

Everything runs on CPU in float64 with torch (always installed); numpy is not a dependency.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterator, Sequence

import torch

STATISTICS = ("median", "mean")

MIN_RESAMPLES = 100

# resamples are drawn in blocks so that memory stays bounded for long runs
_BLOCK_ELEMENTS = 4_000_000


@dataclass(frozen=True)
class Summary:
    """Median and 10th/90th percentiles of one side's samples."""

    num_samples: int
    median: float
    p10: float
    p90: float


@dataclass(frozen=True)
class RatioCI:
    """A candidate/baseline ratio and its bootstrap confidence interval."""

    ratio: float  # the statistic of the candidate over the statistic of the baseline
    lo: float
    hi: float
    confidence: float  # 0.95 for a CI95
    statistic: str  # "median" or "mean"
    num_resamples: int
    seed: int
    method: str = "paired percentile bootstrap"


def quantile(values: Sequence[float], q: float) -> float:
    """The q-quantile with linear interpolation between order statistics (numpy's default)."""
    if not values:
        raise ValueError("quantile of no values; measure at least one sample")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q must lie in [0, 1], got {q}")
    ordered = sorted(float(v) for v in values)
    pos = q * (len(ordered) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def summarize(values: Sequence[float]) -> Summary:
    return Summary(
        num_samples=len(values),
        median=quantile(values, 0.5),
        p10=quantile(values, 0.1),
        p90=quantile(values, 0.9),
    )


def _rowwise(stat: str, x_rn: torch.Tensor) -> torch.Tensor:
    """The statistic of each row; the median averages the two middle values for even n."""
    if stat == "mean":
        return x_rn.mean(dim=1)
    n = x_rn.shape[1]
    # kthvalue selects in linear time; a full sort of every resample is several times slower
    lower = x_rn.kthvalue((n - 1) // 2 + 1, dim=1).values
    if n % 2:
        return lower
    return (lower + x_rn.kthvalue(n // 2 + 1, dim=1).values) / 2


def paired_ratio_ci(
    baseline: Sequence[float],
    candidate: Sequence[float],
    *,
    num_resamples: int = 10_000,
    seed: int = 0,
    confidence: float = 0.95,
    statistic: str = "median",
) -> RatioCI:
    """CI of stat(candidate) / stat(baseline) by a seeded paired percentile bootstrap.

    Legend: r = resample, n = pair.
    """
    if statistic not in STATISTICS:
        raise ValueError(f"statistic must be one of {STATISTICS}, got {statistic!r}")
    if len(baseline) != len(candidate):
        raise ValueError(
            f"paired samples need equal counts, got {len(baseline)} baseline and "
            f"{len(candidate)} candidate samples"
        )
    if len(baseline) < 2:
        raise ValueError(f"a bootstrap needs at least 2 pairs, got {len(baseline)}")
    if num_resamples < MIN_RESAMPLES:
        raise ValueError(f"use at least {MIN_RESAMPLES} resamples for a CI, got {num_resamples}")
    if not 0.5 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0.5, 1), got {confidence}")
    base_n = torch.tensor([float(v) for v in baseline], dtype=torch.float64)
    cand_n = torch.tensor([float(v) for v in candidate], dtype=torch.float64)
    if not (torch.isfinite(base_n).all() and torch.isfinite(cand_n).all()):
        raise ValueError("samples must be finite; drop the non-finite ones before the bootstrap")
    if not (base_n > 0).all() or not (cand_n > 0).all():
        raise ValueError("a ratio needs positive samples (durations, rates or bytes)")
    n = base_n.numel()
    point = _rowwise(statistic, cand_n[None]) / _rowwise(statistic, base_n[None])
    generator = torch.Generator().manual_seed(seed)
    ratios_r = torch.cat([
        _rowwise(statistic, cand_n[idx_rn]) / _rowwise(statistic, base_n[idx_rn])
        for idx_rn in _resample_indices(n, num_resamples, generator)
    ])
    tail = (1.0 - confidence) / 2
    lo, hi = torch.quantile(ratios_r, torch.tensor([tail, 1.0 - tail], dtype=torch.float64))
    return RatioCI(
        ratio=float(point),
        lo=float(lo),
        hi=float(hi),
        confidence=confidence,
        statistic=statistic,
        num_resamples=num_resamples,
        seed=seed,
    )


def median_ci(
    values: Sequence[float], *, num_resamples: int = 10_000, seed: int = 0,
    confidence: float = 0.95,
) -> tuple[float, float, float]:
    """The median of ``values`` and its seeded percentile-bootstrap CI: (median, lo, hi)."""
    _check_ci_args(num_resamples, confidence)
    if len(values) < 2:
        raise ValueError(f"a bootstrap needs at least 2 samples, got {len(values)}")
    values_n = _finite_tensor(values, "samples")
    generator = torch.Generator().manual_seed(seed)
    medians_r = torch.cat([_rowwise("median", values_n[idx_rn]) for idx_rn in
                           _resample_indices(values_n.numel(), num_resamples, generator)])
    lo, hi = _percentiles(medians_r, confidence)
    return float(_rowwise("median", values_n[None])), lo, hi


@dataclass(frozen=True)
class DifferenceCI:
    """The mean of candidate - baseline and its bootstrap confidence interval."""

    difference: float  # mean(candidate) - mean(baseline); paired: the mean per-example difference
    lo: float
    hi: float
    confidence: float
    num_resamples: int
    seed: int
    method: str  # "paired percentile bootstrap" or "unpaired percentile bootstrap"


def _mean_resamples(
    values_n: torch.Tensor, num_resamples: int, generator: torch.Generator
) -> torch.Tensor:
    """The mean of each of ``num_resamples`` resamples (with replacement) of ``values_n``."""
    return torch.cat([values_n[idx_rn].mean(dim=1) for idx_rn in
                      _resample_indices(values_n.numel(), num_resamples, generator)])


def _resample_indices(n: int, num_resamples: int, generator: torch.Generator
                      ) -> Iterator[torch.Tensor]:
    """The indexes of ``num_resamples`` resamples (with replacement) of ``n`` samples, in
    blocks of rows that keep memory bounded."""
    block = max(1, _BLOCK_ELEMENTS // n)
    for start in range(0, num_resamples, block):
        rows = min(block, num_resamples - start)
        yield torch.randint(n, (rows, n), generator=generator)


def _check_ci_args(num_resamples: int, confidence: float) -> None:
    if num_resamples < 100:
        raise ValueError(f"use at least 100 resamples for a CI, got {num_resamples}")
    if not 0.5 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0.5, 1), got {confidence}")


def _finite_tensor(values: Sequence[float], what: str) -> torch.Tensor:
    tensor = torch.tensor([float(v) for v in values], dtype=torch.float64)
    if not torch.isfinite(tensor).all():
        raise ValueError(f"{what} must be finite; drop the non-finite ones before the bootstrap")
    return tensor


def _percentiles(stats_r: torch.Tensor, confidence: float) -> tuple[float, float]:
    tail = (1.0 - confidence) / 2
    lo, hi = torch.quantile(stats_r, torch.tensor([tail, 1.0 - tail], dtype=torch.float64))
    return float(lo), float(hi)


def paired_difference_ci(
    baseline: Sequence[float],
    candidate: Sequence[float],
    *,
    num_resamples: int = 10_000,
    seed: int = 0,
    confidence: float = 0.95,
) -> DifferenceCI:
    """CI of the mean per-pair difference candidate - baseline by a seeded paired bootstrap.

    Pair i is the same example (or step) on both sides; resampling pairs keeps what the two
    sides share (the example's difficulty) out of the interval. Legend: r = resample, n = pair.
    """
    _check_ci_args(num_resamples, confidence)
    if len(baseline) != len(candidate):
        raise ValueError(
            f"paired samples need equal counts, got {len(baseline)} baseline and "
            f"{len(candidate)} candidate samples"
        )
    if len(baseline) < 2:
        raise ValueError(f"a bootstrap needs at least 2 pairs, got {len(baseline)}")
    diff_n = _finite_tensor(candidate, "samples") - _finite_tensor(baseline, "samples")
    generator = torch.Generator().manual_seed(seed)
    lo, hi = _percentiles(_mean_resamples(diff_n, num_resamples, generator), confidence)
    return DifferenceCI(
        float(diff_n.mean()), lo, hi, confidence, num_resamples, seed, "paired percentile bootstrap"
    )


def unpaired_difference_ci(
    baseline: Sequence[float],
    candidate: Sequence[float],
    *,
    num_resamples: int = 10_000,
    seed: int = 0,
    confidence: float = 0.95,
) -> DifferenceCI:
    """CI of mean(candidate) - mean(baseline), each side resampled on its own.

    For samples that are not the same examples on both sides; the interval is wider than a
    paired one because the examples' own spread stays in it.
    """
    _check_ci_args(num_resamples, confidence)
    if len(baseline) < 2 or len(candidate) < 2:
        raise ValueError(
            f"a bootstrap needs at least 2 samples per side, got {len(baseline)} and "
            f"{len(candidate)}"
        )
    base_n = _finite_tensor(baseline, "samples")
    cand_n = _finite_tensor(candidate, "samples")
    generator = torch.Generator().manual_seed(seed)
    base_r = _mean_resamples(base_n, num_resamples, generator)
    cand_r = _mean_resamples(cand_n, num_resamples, generator)
    lo, hi = _percentiles(cand_r - base_r, confidence)
    return DifferenceCI(
        float(cand_n.mean() - base_n.mean()),
        lo,
        hi,
        confidence,
        num_resamples,
        seed,
        "unpaired percentile bootstrap",
    )
