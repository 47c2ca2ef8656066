"""``--fit PARAM``: the largest value of an integer factory parameter whose predicted reserved
peak fits the GPU with a margin.

The search assumes the peak grows with the parameter (true of batch size, sequence length and
layer count). From the starting value it doubles (or halves) until it brackets the boundary,
then bisects the bracket; every value it predicts is kept, in order, as the curve it searched.
"""

from __future__ import annotations

from collections.abc import Callable

from levers.hardware import GpuSpec
from levers.memory.plan import FitPoint, FitResult
from levers.memory.prediction import Source, run_prediction

MAX_EVALUATIONS = 16


def search_largest(
    evaluate: Callable[[int], FitPoint],
    start: int,
    *,
    upper: int | None = None,
    max_evaluations: int = MAX_EVALUATIONS,
) -> tuple[int | None, tuple[FitPoint, ...]]:
    """The largest ``value >= 1`` with ``evaluate(value).fits``, for a monotone predicate.

    Returns ``(best, curve)``: ``best`` is None when even 1 does not fit; the curve holds every
    point evaluated, in the order tried. ``upper`` caps the search from above (inclusive).
    """
    if start < 1:
        raise ValueError(f"the search must start at a value >= 1, got {start}")
    curve: list[FitPoint] = []
    cache: dict[int, FitPoint] = {}

    def fits(value: int) -> bool:
        if value not in cache:
            if len(cache) >= max_evaluations:
                raise _Exhausted
            cache[value] = evaluate(value)
            curve.append(cache[value])
        return cache[value].fits

    low, high = None, None  # largest known fit, smallest known non-fit
    try:
        if fits(start):
            low, value = start, start
            while upper is None or value < upper:
                value = value * 2 if upper is None else min(value * 2, upper)
                if not fits(value):
                    high = value
                    break
                low = value
            else:
                return low, tuple(curve)
        else:
            high, value = start, start
            while value > 1:
                value = max(value // 2, 1)
                if fits(value):
                    low = value
                    break
                high = value
            if low is None:
                return None, tuple(curve)
        while high - low > 1:
            middle = (low + high) // 2
            if fits(middle):
                low = middle
            else:
                high = middle
    except _Exhausted:
        pass
    return low, tuple(curve)


class _Exhausted(Exception):
    """The evaluation budget ran out; the best value so far stands."""


def fit_param(
    source: Source,
    gpu: GpuSpec,
    param: str,
    *,
    margin: float,
    start: int,
    num_steps: int,
    upper: int | None = None,
    progress: Callable[[FitPoint], None] | None = None,
) -> FitResult:
    """Bisect ``param`` for the largest value whose predicted reserved peak fits ``gpu``."""
    budget = int(gpu.usable_bytes * (1.0 - margin))

    def evaluate(value: int) -> FitPoint:
        prediction = run_prediction(source.with_params(**{param: value}), gpu, num_steps=num_steps)
        point = FitPoint(
            value=value,
            peak_allocated_bytes=prediction.replay.peak_allocated_bytes,
            peak_reserved_bytes=prediction.replay.peak_reserved_bytes,
            fits=prediction.replay.peak_reserved_bytes <= budget,
        )
        if progress is not None:
            progress(point)
        return point

    best, curve = search_largest(evaluate, start, upper=upper)
    return FitResult(param=param, best=best, budget_bytes=budget, margin=margin, curve=curve)
