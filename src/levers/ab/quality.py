"""The quality read of an A/B: per-example loss on a fixed held-out set, paired between sides.

The parity gate bounds how far a numerics-changing candidate's losses and gradients drift over a
few steps; it does not say whether the drift costs quality. The quality read does: after the
timed steps (both sides have taken the same steps), each side's ``Workload.eval_losses()`` hook
returns the per-example losses of one fixed held-out batch set, the same examples in the same
order on both sides; the read is the mean per-example difference candidate - baseline with a
seeded paired bootstrap CI95, judged like every other read (lower is better).

The hook is optional. Without it on both sides, or for a candidate declared exact (the parity
gate already holds it to the same math), the read is not measured and says why.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from levers.ab.stats import DifferenceCI, paired_difference_ci
from levers.ab.verdict import NOT_MEASURED, difference_verdict
from levers.workload import Workload

HOOK = "eval_losses"


@dataclass(frozen=True)
class QualityRead:
    verdict: str
    ci: DifferenceCI | None
    num_examples: int | None
    baseline_mean: float | None
    candidate_mean: float | None
    note: str


def _skipped(note: str) -> QualityRead:
    return QualityRead(NOT_MEASURED, None, None, None, None, note)


def _losses(workload: Workload, seed: int) -> torch.Tensor:
    torch.manual_seed(seed)  # the same dropout masks (if the hook leaves dropout on) per side
    with torch.no_grad():
        value = workload.eval_losses()
    if not isinstance(value, torch.Tensor) or value.ndim != 1:
        raise ValueError(
            f"{HOOK}() must return a 1-D tensor of per-example losses, got "
            f"{getattr(value, 'shape', type(value).__name__)}"
        )
    return value.detach().to("cpu", torch.float64)  # sync point: once per side, after timing


def quality_read(
    baseline: Workload,
    candidate: Workload,
    exactness: str,
    *,
    num_resamples: int,
    seed: int,
    confidence: float = 0.95,
) -> QualityRead:
    """The paired per-example held-out loss read, or why it was not measured."""
    workloads = (baseline, candidate)
    if exactness != "exact" and all(w.eval_losses is not None for w in workloads):
        a, b = (held_out_losses(w, seed) for w in workloads)
    else:  # no hook is run: quality_from says why
        a, b = (NO_HOOK if w.eval_losses is None else None for w in workloads)
    return quality_from(
        a, b, exactness, num_resamples=num_resamples, seed=seed, confidence=confidence
    )


def _no_hook(missing: list[str]) -> QualityRead:
    who = (
        "the baseline and candidate workloads set"
        if len(missing) == 2
        else f"the {missing[0]} workload sets"
    )
    return _skipped(
        f"skipped: {who} no {HOOK} hook (per-example losses on a fixed held-out batch set; "
        "see docs/ab.md)"
    )


# what held_out_losses returns for a workload without the hook
NO_HOOK = "no hook"


def held_out_losses(workload: Workload, seed: int) -> torch.Tensor | str:
    """One side's per-example held-out losses, or why there are none (:data:`NO_HOOK`, or what
    the hook raised): for an A/B whose sides run one at a time, read before the side is freed."""
    if workload.eval_losses is None:
        return NO_HOOK
    try:
        return _losses(workload, seed)
    except Exception as exc:  # noqa: BLE001 - the user's hook may raise anything
        return f"{HOOK}() raised {type(exc).__name__}: {exc}"


def quality_from(
    a: torch.Tensor | str | None,
    b: torch.Tensor | str | None,
    exactness: str,
    *,
    num_resamples: int,
    seed: int,
    confidence: float = 0.95,
) -> QualityRead:
    """The quality read from each side's :func:`held_out_losses` (None: the side never got
    that far)."""
    if exactness == "exact":
        return _skipped("declared exact: the parity gate holds the candidate to the same math")
    sides = (("baseline", a), ("candidate", b))
    missing = [side for side, value in sides if isinstance(value, str) and value == NO_HOOK]
    if missing:
        return _no_hook(missing)
    for side, value in sides:
        if value is None:
            return _skipped(f"skipped: the {side} did not reach its held-out losses")
        if isinstance(value, str):
            return _skipped(value)
    return compare_losses(a, b, num_resamples=num_resamples, seed=seed, confidence=confidence)


def compare_losses(
    a: torch.Tensor, b: torch.Tensor, *, num_resamples: int, seed: int, confidence: float
) -> QualityRead:
    """The paired difference of two sides' per-example held-out losses."""
    if a.numel() != b.numel() or a.numel() < 2:
        return _skipped(
            f"{HOOK}() returned {a.numel()} baseline and {b.numel()} candidate losses; the "
            "sides must score the same held-out examples (at least 2)"
        )
    if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
        return _skipped(f"{HOOK}() returned non-finite losses; no CI")
    ci = paired_difference_ci(
        a.tolist(), b.tolist(), num_resamples=num_resamples, seed=seed, confidence=confidence
    )
    return QualityRead(
        difference_verdict(ci.lo, ci.hi, "lower"),
        ci,
        a.numel(),
        float(a.mean()),
        float(b.mean()),
        f"{a.numel()} held-out examples, paired",
    )
