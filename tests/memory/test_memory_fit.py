"""The --fit search: on a synthetic monotone function and on a small workload."""

from __future__ import annotations

import memory_factories as factories
import pytest

from levers.memory.fit import fit_param, search, search_largest
from levers.hardware import GpuSpec
from levers.memory.options import MemoryOptions
from levers.memory.plan import FitPoint, FitResult
from levers.memory.prediction import run_prediction, source_of


def _limit(largest: int):
    calls = []

    def evaluate(value: int) -> FitPoint:
        calls.append(value)
        return FitPoint(value, value * 10, value * 11, value <= largest)

    return evaluate, calls


def test_doubles_up_then_bisects():
    evaluate, calls = _limit(37)
    best, curve = search_largest(evaluate, 4)
    assert best == 37
    assert calls == [4, 8, 16, 32, 64, 48, 40, 36, 38, 37]
    assert [p.value for p in curve] == calls


def test_halves_down_when_the_start_does_not_fit():
    evaluate, calls = _limit(5)
    best, _ = search_largest(evaluate, 32)
    assert best == 5
    assert calls == [32, 16, 8, 4, 6, 5]


def test_nothing_fits_and_the_cap_holds():
    evaluate, _ = _limit(0)
    assert search_largest(evaluate, 8)[0] is None
    evaluate, calls = _limit(100)
    assert search_largest(evaluate, 3, upper=10)[0] == 10
    assert calls == [3, 6, 10]


def _linear(largest_bytes: int, fixed: int = 1000, per_value: int = 3):
    calls = []

    def evaluate(value: int) -> FitPoint:
        calls.append(value)
        peak = fixed + per_value * value
        return FitPoint(value, peak, peak, peak <= largest_bytes)

    return evaluate, calls


def test_a_far_boundary_is_bracketed_not_cut_off_after_16_predictions():
    # the boundary is 2**20 above the start: doubling alone needs 21 predictions, and the old
    # search printed the last value it doubled to after 16
    budget = 1000 + 3 * 1_500_000
    evaluate, calls = _linear(budget)
    found = search(evaluate, 1, budget=budget)
    assert found.best == 1_500_000
    assert found.stopped == "" and found.not_fitting == 1_500_001
    assert len(calls) <= 12


def test_a_search_that_runs_out_says_at_least():
    evaluate, _ = _limit(10**9)
    found = search(evaluate, 1, max_evaluations=5)
    assert found.stopped == "evaluations" and found.best == 16
    result = FitResult("batch_size", found.best, 100, 0.05, found.curve, found.stopped)
    assert result.statement().startswith("at least 16 (the search stopped")


def test_a_cap_that_fits_is_one_prediction_and_said():
    budget = 10**9
    evaluate, calls = _linear(budget)
    found = search(evaluate, 4, upper=64, budget=budget, known=(evaluate(4),))
    assert found.best == 64 and found.stopped == "cap"
    assert calls == [4, 64]  # the known start is not predicted again
    result = FitResult("batch_size", 64, budget, 0.05, found.curve, "cap", upper=64)
    assert result.statement() == "at least 64 (the search stopped at its cap, 64)"


def test_a_start_below_one_is_refused():
    evaluate, _ = _limit(3)
    with pytest.raises(ValueError, match=">= 1"):
        search_largest(evaluate, 0)


def test_fit_a_workload_to_a_budget():
    # activations above 10 MiB get segments of their own size: the reserved peak grows with
    # the batch (in 2 MiB steps)
    source = source_of(factories.stack, {"batch_size": 256, "width": 1024, "depth": 2})
    budget = run_prediction(source.with_params(batch_size=1500), _gpu(1 << 40), num_steps=1)
    gpu = _gpu(budget.replay.peak_reserved_bytes)
    result = fit_param(
        source, MemoryOptions(gpu=gpu, margin=0.0, num_steps=1), "batch_size", start=256
    )
    assert result.budget_bytes == budget.replay.peak_reserved_bytes
    assert result.best is not None and result.best >= 1500
    by_value = {p.value: p for p in result.curve}
    assert by_value[result.best].fits
    assert by_value[result.best].peak_reserved_bytes <= result.budget_bytes
    # closed: the next value known not to fit is within 0.1% of the fit
    assert result.exact and result.not_fitting - result.best <= max(1, result.best // 1000)
    next_up = run_prediction(source.with_params(batch_size=result.not_fitting), gpu, num_steps=1)
    assert next_up.replay.peak_reserved_bytes > result.budget_bytes
    # the reserved peak is a staircase here (12 MiB segments): no worse than doubling and
    # bisection, which take 16
    assert len(result.curve) <= 16


def _gpu(usable: int) -> GpuSpec:
    from levers.hardware import CONTEXT_BYTES

    return GpuSpec("test", usable + CONTEXT_BYTES, (9, 0), "a test budget")
