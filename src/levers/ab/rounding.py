"""Is a failed float64-reference gate the candidate's math, or the step's rounding amplified?

The gate allows the candidate ``REFERENCE_MARGIN`` times the baseline's own distance to the float64
run. A step that amplifies rounding (a tiny BatchNorm convnet: one Adam step multiplied a
channels-last candidate's difference by ~100 on the CPU) can carry a correct candidate past that:
its fp32 run is one rounding of the same function, the baseline's another, and the two drift
apart by chance. What tells rounding from math is a float64 run of the candidate itself: a
candidate that computes the baseline's function matches the baseline's float64 run to float64's
rounding, amplified alike (1e-13 to 1e-8 on the CPU sweep's channels-last failures, against fp32
differences of 1e-3 to 1e-1); one that changes the math differs there as in fp32.

So after a gate that failed against the float64 run, where the baseline repeated itself (the
difference is the candidate's, :mod:`levers.ab.repeat`), the candidate is run in float64 too
(:func:`levers.ab.reference.run_reference` on its build) and each failed check is compared:
when the candidate's float64 value is within ``ROUNDING_SHARE`` of its fp32 difference from the
baseline's float64 value (a difference of float64's rounding, ~5e8 times finer than fp32's, with
four orders of margin either way), the verdict becomes PARITY and the note says why; else it
stands, with the float64 difference said.

Only for candidates whose change a float64 run keeps (``Lever.float64_faithful``, on every lever
of both sides): the reference runs a compiled model eagerly and autocast leaves float64 alone,
so a float64 run of a compile or autocast lever would compute the baseline's function whatever
the lever does. It costs one more build and the parity steps in float64, only after such a
failed gate.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from levers.ab.killlines import Kill, KillLines
from levers.ab.parity import RULE_REFERENCE, ParityCheck, ParityResult, rel_diff
from levers.ab.reference import Reference, run_reference
from levers.ab.repeat import REPEATED
from levers.workload import Workload

# a failed check is rounding when the candidate's float64 run is at most this share of its fp32
# difference away from the baseline's float64 run
ROUNDING_SHARE = 1e-4


def _float64_value(run: Reference, check: ParityCheck) -> float | None:
    series = run.losses if check.quantity == "loss" else run.grad_norms
    return series[check.step - 1] if check.step - 1 < len(series) else None


def check_rounding(
    build_candidate: Callable[[], Workload],
    result: ParityResult,
    *,
    faithful: bool,
    seed: int,
    lines: KillLines,
) -> tuple[ParityResult, Kill | None]:
    """``result`` after the candidate's own float64 run, where it failed against the float64 run
    with the baseline repeating itself and the candidate's change is ``faithful`` to float64;
    any other result as it is. The kill is Ctrl-C's during that run, for the caller to stop on."""
    failed = [c for c in result.checks if c.gating and c.passed is False]
    if (result.passed is not False or not faithful or not failed
            or not result.repeat.startswith(REPEATED)
            or any(c.rule != RULE_REFERENCE or c.reference is None or not c.candidate_error
                   for c in failed)):
        return result, None
    run, kill = run_reference(build_candidate, num_steps=result.num_steps, seed=seed, lines=lines)
    if kill is not None:
        return result, kill if kill.kind == "interrupted" else None
    if not run.available:
        return _noted(result, f"the candidate's float64 run was not made ({run.why_not})"), None
    worst = (0.0, 0.0)  # the largest float64 difference, and its share of the fp32 one
    for check in failed:
        value = _float64_value(run, check)
        if value is None:
            return _noted(result, "the candidate's float64 run has no value to compare"), None
        difference = rel_diff(check.reference, value)
        share = difference / check.candidate_error
        worst = max(worst, (difference, share))
        if share > ROUNDING_SHARE:
            return _noted(
                result,
                f"in float64 too the candidate differs from the baseline ({check.quantity} after "
                f"step {check.step} by {difference:.3g}, {share:.2g} of its fp32 difference): its "
                "math differs, not only its rounding",
            ), None
    return replace(
        result,
        passed=True,
        repeat=(
            f"{result.repeat}; in float64 the candidate computes what the baseline computes (the "
            f"failed checks' float64 values {worst[0]:.2g} apart, {worst[1]:.2g} of their fp32 "
            "difference): that difference is this step's fp32 rounding, amplified, not the "
            "lever's math"
        ),
    ), None


def _noted(result: ParityResult, note: str) -> ParityResult:
    return replace(result, repeat=f"{result.repeat}; {note}" if result.repeat else note)
