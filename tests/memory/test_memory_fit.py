"""The --fit search: on a synthetic monotone function and on a small workload."""

from __future__ import annotations

import memory_factories as factories
import pytest

from levers.memory.fit import fit_param, search_largest
from levers.hardware import GpuSpec
from levers.memory.plan import FitPoint
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
    result = fit_param(source, gpu, "batch_size", margin=0.0, start=256, num_steps=1)
    assert result.budget_bytes == budget.replay.peak_reserved_bytes
    assert result.best is not None and result.best >= 1500
    by_value = {p.value: p for p in result.curve}
    assert by_value[result.best].fits
    assert by_value[result.best].peak_reserved_bytes <= result.budget_bytes
    next_up = run_prediction(source.with_params(batch_size=result.best + 1), gpu, num_steps=1)
    assert next_up.replay.peak_reserved_bytes > result.budget_bytes
    assert [p.value for p in result.curve][:3] == [256, 512, 1024]


def _gpu(usable: int) -> GpuSpec:
    from levers.hardware import CONTEXT_BYTES

    return GpuSpec("test", usable + CONTEXT_BYTES, (9, 0), "a test budget")
