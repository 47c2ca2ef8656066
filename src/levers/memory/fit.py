"""``--fit PARAM``: the largest value of an integer factory parameter whose predicted reserved
peak fits the GPU with a margin.

The search assumes the peak grows with the parameter (true of batch size, sequence length and
layer count). It brackets the budget (a value that fits and one that does not), then narrows
the bracket until the two are neighbours (or, for large values, within 0.1% of each other). Given the budget it guesses each next value from the
peaks already predicted (the peak is close to linear in the batch: a fixed part, parameters and
optimizer state, plus activations per sample), so a fit that doubling and bisection would find in
20 predictions takes about 5; a guess that fails to halve the bracket is followed by a midpoint,
so it never takes more than about twice the bisection's count. Given a cap (``upper``) it tries
the cap first: when the cap fits, one prediction answers.

Every value it predicts is kept, in order, as the curve it searched. When the search ends before
the bracket closes (the cap fits, or the predictions allowed ran out) the result says so:
``stopped`` is "cap" or "evaluations", and the best is "at least" that value.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from levers.memory.options import MemoryOptions
from levers.memory.plan import FitPoint, FitResult
from levers.memory.prediction import Prediction, Source, run_prediction

# predictions a search may make (a budget-guided search of a batch up to millions takes ~8)
MAX_EVALUATIONS = 24
STOPPED_AT_CAP, STOPPED_EVALUATIONS = "cap", "evaluations"
# a guess from the line is pushed this far past it, so that it brackets the budget from above
OVERSHOOT = 1.02
# the bracket is closed when it is this narrow (relative to the fit): a batch of 200,000 is not
# worth ten more predictions, each of a 200,000-sample step, to pin its last 0.1%
TOLERANCE = 0.001
# the step up when the peaks so far do not grow (small batches share the allocator's blocks)
FIRST_STEP = 8


@dataclass(frozen=True)
class Search:
    best: int | None  # None when even 1 does not fit
    curve: tuple[FitPoint, ...]  # every point evaluated, in the order tried
    stopped: str = ""  # "" (bracketed to neighbours or nothing fits), "cap" or "evaluations"
    not_fitting: int | None = None  # the smallest value known not to fit


def search_largest(
    evaluate: Callable[[int], FitPoint],
    start: int,
    *,
    upper: int | None = None,
    max_evaluations: int = MAX_EVALUATIONS,
) -> tuple[int | None, tuple[FitPoint, ...]]:
    """The largest ``value >= 1`` with ``evaluate(value).fits``, for a monotone predicate, by
    doubling (or halving) then bisection. Returns ``(best, curve)``; see :func:`search`."""
    found = search(evaluate, start, upper=upper, max_evaluations=max_evaluations)
    return found.best, found.curve


def search(
    evaluate: Callable[[int], FitPoint],
    start: int,
    *,
    upper: int | None = None,
    max_evaluations: int = MAX_EVALUATIONS,
    budget: int | None = None,
    known: Sequence[FitPoint] = (),
    tolerance: float = 0.0,
) -> Search:
    """The largest ``value >= 1`` with ``evaluate(value).fits``, for a monotone predicate.

    ``upper`` caps the search from above (inclusive). ``budget`` (the reserved bytes a point
    must stay under) lets the search guess from the peaks; without it, it doubles and bisects.
    ``known`` are points already predicted (the plan's own), reused rather than predicted again.
    ``tolerance``: the search ends when the bracket is narrower than this share of the fit.
    """
    if start < 1:
        raise ValueError(f"the search must start at a value >= 1, got {start}")
    if upper is not None and upper < 1:
        raise ValueError(f"the search's cap must be >= 1, got {upper}")
    curve: list[FitPoint] = []
    cache: dict[int, FitPoint] = {p.value: p for p in known}
    evaluated = [0]

    def point(value: int) -> FitPoint:
        if value not in cache:
            if evaluated[0] >= max_evaluations:
                raise _Exhausted
            evaluated[0] += 1
            cache[value] = evaluate(value)
        if cache[value] not in curve:
            curve.append(cache[value])
        return cache[value]

    def fits(value: int) -> bool:
        return point(value).fits

    low, high = None, None  # largest known fit, smallest known non-fit
    if upper is not None:
        start = min(start, upper)
    try:
        if fits(start):
            low = start
            while upper is None or low < upper:
                value = _next_up(cache, low, upper, budget)
                if not fits(value):
                    high = value
                    break
                low = value
            else:
                return Search(low, tuple(curve), STOPPED_AT_CAP if upper is not None else "")
        else:
            high, value = start, start
            while value > 1:
                value = max(value // 2, 1)
                if fits(value):
                    low = value
                    break
                high = value
            if low is None:
                return Search(None, tuple(curve), "", high)
        halved = True
        while high - low > max(1, int(low * tolerance)):
            guess = _interpolate(cache, low, high, budget) if halved else None
            middle = guess if guess is not None else (low + high) // 2
            width = high - low
            if fits(middle):
                low = middle
            else:
                high = middle
            # a guess that did not halve the bracket is followed by a midpoint
            halved = guess is None or 2 * (high - low) <= width
    except _Exhausted:
        return Search(low, tuple(curve), STOPPED_EVALUATIONS, high)
    return Search(low, tuple(curve), "", high)


def _next_up(cache: dict[int, FitPoint], low: int, upper: int | None, budget: int | None) -> int:
    """The next value to try above ``low`` (which fits)."""
    if budget is None:
        value = low * 2
    elif upper is not None and upper not in cache:
        value = upper  # the cap first: when it fits, the search is over
    else:
        below = sorted(v for v, p in cache.items() if p.fits and v < low)
        estimate = _crossing(cache, below[-1], low, budget) if below else None
        if estimate is None:
            value = low * FIRST_STEP
        else:
            value = max(low + 1, math.ceil(estimate * OVERSHOOT) + 1)
    return value if upper is None else min(value, upper)


def _interpolate(
    cache: dict[int, FitPoint], low: int, high: int, budget: int | None
) -> int | None:
    """A value strictly inside (low, high) where the line through their peaks meets the budget."""
    if budget is None:
        return None
    estimate = _crossing(cache, low, high, budget)
    if estimate is None:
        return None
    return min(max(math.floor(estimate), low + 1), high - 1)


def _crossing(cache: dict[int, FitPoint], a: int, b: int, budget: int) -> float | None:
    """Where the line through the reserved peaks at ``a`` and ``b`` reaches ``budget``."""
    peak_a, peak_b = cache[a].peak_reserved_bytes, cache[b].peak_reserved_bytes
    if b == a or peak_b <= peak_a:
        return None
    slope = (peak_b - peak_a) / (b - a)
    return a + (budget - peak_a) / slope


class _Exhausted(Exception):
    """The evaluation budget ran out; the best value so far stands."""


def fit_point(prediction: Prediction, value: int, budget: int) -> FitPoint:
    peak = prediction.replay.peak_reserved_bytes
    return FitPoint(
        value=value,
        peak_allocated_bytes=prediction.replay.peak_allocated_bytes,
        peak_reserved_bytes=peak,
        fits=peak <= budget,
    )


def fit_param(
    source: Source,
    options: MemoryOptions,
    param: str,
    *,
    start: int,
    upper: int | None = None,
    progress: Callable[[FitPoint], None] | None = None,
    known: Sequence[FitPoint] = (),
    max_evaluations: int = MAX_EVALUATIONS,
    transform: Callable | None = None,
) -> FitResult:
    """The largest ``param`` whose predicted reserved peak fits ``options.gpu`` less
    ``options.margin``, each value predicted over ``options.num_steps`` steps (one rank:
    ``options.world_size`` and the what-ifs are not read).

    ``known``: points already predicted with the same steps (the plan at ``start``), reused.
    ``transform``: applied to each built workload before its steps (levers raise-batch runs).
    """
    budget = int(options.gpu.usable_bytes * (1.0 - options.margin))

    def evaluate(value: int) -> FitPoint:
        prediction = run_prediction(
            source.with_params(**{param: value}), options.gpu, num_steps=options.num_steps,
            transform=transform,
        )
        point = fit_point(prediction, value, budget)
        if progress is not None:
            progress(point)
        return point

    found = search(
        evaluate, start, upper=upper, max_evaluations=max_evaluations, budget=budget, known=known,
        tolerance=TOLERANCE,
    )
    return FitResult(
        param=param,
        best=found.best,
        budget_bytes=budget,
        margin=options.margin,
        curve=found.curve,
        stopped=found.stopped,
        upper=upper,
        not_fitting=found.not_fitting,
    )
