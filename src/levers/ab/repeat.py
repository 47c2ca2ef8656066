"""Is a failed parity gate the candidate's doing, or does the baseline not repeat itself?

The gate holds the candidate to the baseline (or to the float64 run), both built and stepped
from one seed. A model that draws from outside that seed (a reversible layer that reseeds from
the OS, a kernel whose result depends on thread timing) differs from itself run twice, and then
every candidate fails the gate, a lever that changes nothing included. So when the gate fails,
the baseline is built once more from the same seed and stepped as before:

- it repeats the first run within the tolerance the candidate was held to: the difference is the
  candidate's, and the verdict stands (``repeat`` says the baseline repeated);
- it does not: the gate cannot tell the candidate's change from the step's own variation, and
  the result says so (``passed`` None: NOT_MEASURED, never PARITY);
- it computed what the candidate computed instead: the candidate's change leaked into a model
  built beside it (a lever that patched something global), and the verdict stands, with that
  said.

It costs one more build and the parity steps (the gate's own, :func:`levers.ab.parity.
run_parity_steps`), only after a failed gate, while both sides are resident; where that does
not fit (out of memory), the time budget ends it or the second run stops otherwise, the verdict
stands unchecked and a note says so; Ctrl-C there is handed back to the caller as its kill.
"""

from __future__ import annotations

import gc
from dataclasses import replace
from typing import Callable

import torch

from levers.ab.killlines import Kill, KillLines
from levers.ab.parity import ParityResult, rel_diff, run_parity_steps
from levers.workload import Workload

QUANTITIES = ("loss", "grad_norm")
# a second baseline that computed "as the candidate did" must match it this closely (a share of
# the tolerance): the same computation repeats to rounding, a noisy step's runs only by chance
SAME_AS_CANDIDATE = 0.01
# how a failed gate's note begins once the baseline repeated itself: the difference is the
# candidate's (levers.ab.rounding then asks whether it is its math or the step's rounding)
REPEATED = "the baseline repeated itself from the same seed"


def _series(result: ParityResult, side: str) -> dict[str, tuple[float | None, ...]]:
    return {
        "loss": getattr(result, f"{side}_losses"),
        "grad_norm": getattr(result, f"{side}_grad_norms"),
    }


def _run_again(
    build: Callable[[], Workload], num_steps: int, seed: int, lines: KillLines
) -> tuple[dict[str, list[float | None]], Kill | None]:
    torch.manual_seed(seed)
    again = build()
    losses: dict[str, list[float | None]] = {"baseline": []}
    norms: dict[str, list[float | None]] = {"baseline": []}
    try:
        kill = run_parity_steps((("baseline", again),), num_steps, seed, lines, losses, norms)
    finally:
        del again
        gc.collect()
    return {"loss": losses["baseline"], "grad_norm": norms["baseline"]}, kill


def _largest(
    first: dict[str, tuple[float | None, ...]],
    again: dict[str, list[float | None]],
    result: ParityResult,
) -> tuple[float, str] | None:
    """The largest relative difference between two runs over the gate's checkpoints, measured
    against the tolerance of each step: (difference / tolerance, its description)."""
    worst: tuple[float, str] | None = None
    for step in sorted({1, result.num_steps}):
        rtol = result.tolerance.rtol_first if step == 1 else result.tolerance.rtol_last
        for quantity in QUANTITIES:
            a, b = first[quantity][step - 1], again[quantity][step - 1]
            if a is None or b is None:
                continue
            diff = rel_diff(a, b)
            if worst is None or diff / rtol > worst[0]:
                worst = (diff / rtol, f"{quantity} after step {step} by {diff:.3g}")
    return worst


def check_repeatable(
    build_baseline: Callable[[], Workload],
    result: ParityResult,
    *,
    seed: int,
    lines: KillLines,
) -> tuple[ParityResult, Kill | None]:
    """``result`` (a gate that failed: ``passed`` False) after the baseline is run once more
    from the same seed; any other result is returned as it is. The kill is Ctrl-C's during the
    second run, for the caller to stop on; any other stop leaves the verdict with a note."""
    if result.passed is not False or result.num_steps < 1:
        return result, None
    try:
        again, kill = _run_again(build_baseline, result.num_steps, seed, lines)
    except torch.OutOfMemoryError:
        return _noted(result, "the baseline's repeatability was not checked (out of memory)"), None
    if kill is not None:
        why = "the time budget ended it" if kill.kind == "time_budget" else kill.reason
        noted = _noted(result, f"the baseline's repeatability was not checked ({why})")
        return noted, kill if kill.kind == "interrupted" else None
    return _judged(result, again), None


def _judged(result: ParityResult, again: dict[str, list[float | None]]) -> ParityResult:
    """The failed ``result`` with what the baseline's second run (``again``) says of it."""
    baseline = _largest(_series(result, "baseline"), again, result)
    if baseline is None:
        return _noted(result, "the baseline's repeatability was not checked (no finite values)")
    ratio, where = baseline
    if ratio <= 1.0:
        how = "matched the first exactly" if ratio == 0 else (
            f"differed at most {ratio:.2g}x the tolerance")
        return _noted(
            result,
            f"{REPEATED} (a second run {how}): the "
            "difference is the candidate's",
        )
    candidate = _largest(_series(result, "candidate"), again, result)
    if candidate is not None and candidate[0] <= SAME_AS_CANDIDATE:
        return _noted(
            result,
            "a second baseline built after the candidate computed as the candidate did: the "
            "candidate's change reaches models built beside it (something global was patched)",
        )
    return replace(
        result,
        passed=None,
        repeat=(
            f"not repeatable: the baseline run twice from the same seed differs ({where}, "
            f"{ratio:.3g}x the tolerance), so the gate cannot tell the candidate's change from "
            "the step's own variation; make the step deterministic from torch.manual_seed "
            "(no reseeding from the OS, deterministic kernels) to judge it"
        ),
    )


def _noted(result: ParityResult, note: str) -> ParityResult:
    return replace(result, repeat=note)
