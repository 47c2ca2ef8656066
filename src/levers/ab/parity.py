"""The parity gate: does the candidate compute the same training step as the baseline?

Both sides are built from the same seed (same weights), and the global RNG is reseeded to the
same value before each side's k-th parity step (same random batches, same dropout masks). After
step 1 and after step K the gate compares the loss and the total gradient norm; after step K it
also compares the parameters when both models name and shape them alike.

Two rules judge a loss or a gradient norm, and each check records which one did:

- **float64 reference** (changes-numerics, the default): the baseline's workload is run once more
  in float64 (``levers.ab.reference``), and the candidate passes when its relative error against
  that run is at most ``REFERENCE_MARGIN`` times the baseline's own error plus a floor (the fixed
  tolerance below for the precision the step computes in): a correct change under bf16 is about as
  far from the float64 run as the baseline is, however far two bf16 runs drift apart; a wrong one
  is farther. The floor covers a candidate that computes in lower precision than the baseline
  (bf16 autocast against fp32), whose rounding the baseline's error cannot show.
- **fixed tolerance** (``exact``, or when no float64 run can be made, with the reason): the
  relative difference between the two sides against the tolerance for the declared exactness and
  the compute dtype. ``exact`` means the change must not alter the math, so the sides are held to
  each other directly, parameters included.

Parameter differences gate only an ``exact`` candidate (against the baseline); for a
changes-numerics one they are reported as evidence, since Adam-like optimizers turn rounding
noise in near-zero gradients into full-size updates.

The parity steps run on the same objects that are timed afterwards, before any timing: both
sides then enter warm-up having taken the same number of steps (so lazily created optimizer
state exists on both). The float64 reference runs before the sides are built, on its own build.
"""

from __future__ import annotations

import math
from contextlib import ExitStack
from dataclasses import dataclass, fields, replace
from typing import Any, Callable

import torch

from levers.ab.gradnorm import grad_norm_probe
from levers.ab.killlines import Kill, KillLines, KillSignal, check_loss, check_time
from levers.ab.precision import LOW_PRECISION, autocast_probe
from levers.ab.reference import Reference, run_reference, unavailable
from levers.ab.steps import run_step
from levers.workload import Workload
from levers.vocab import CHANGES_NUMERICS, EXACT, FIX_SAFETIES, fix_safety

EXACTNESS = FIX_SAFETIES

# (exactness, low precision) -> relative tolerance (after step 1, after step K)
RTOL = {
    (EXACT, False): (1e-6, 1e-5),
    (EXACT, True): (1e-3, 1e-2),
    (CHANGES_NUMERICS, False): (1e-4, 1e-3),
    (CHANGES_NUMERICS, True): (1e-2, 2e-2),
}

# The candidate's error against the float64 run may be this many times the baseline's own (as
# PyTorch's compile accuracy checks allow for bf16/fp16 and for small tensors: our quantities are
# scalars, whose rounding error is noisier than a whole tensor's RMS).
REFERENCE_MARGIN = 3.0

RULE_REFERENCE = "float64-reference"
RULE_TOLERANCE = "tolerance"
RULE_MIXED = "mixed"  # the float64 run where it had a value, the fixed tolerance elsewhere
EXACT_REASON = "declared exact: held to the baseline directly"

_LOW_PRECISION_NAMES = {"bf16", "bfloat16", "fp16", "float16", "half"}


@dataclass(frozen=True)
class Tolerance:
    exactness: str
    low_precision: bool
    rtol_first: float  # after step 1
    rtol_last: float  # after step K
    autocast: str | None = None  # the autocast dtype seen in the step ("bfloat16"), if any
    # the float64-reference rule's factor on the baseline's error (None: the fixed tolerance)
    margin: float | None = None
    # the least tolerance the candidate's levers declare (float8's), when it raised the table's
    floor: float | None = None
    floor_of: str = ""  # the lever that declared it


@dataclass(frozen=True)
class ParityCheck:
    """One compared quantity at one step, with the numbers."""

    step: int
    quantity: str  # "loss", "grad_norm", "params"
    baseline: float | None  # for "params": the L2 norm of all of that side's parameters
    candidate: float | None
    rel_diff: float | None  # |candidate - baseline| / max(|.|); for "params" ||b - a|| / ||a||
    rtol: float  # the fixed tolerance; under the float64-reference rule, the floor
    passed: bool | None  # None: could not be compared
    gating: bool  # False: reported as evidence only
    rule: str = RULE_TOLERANCE  # which rule judged it (records before the reference read so)
    reference: float | None = None  # the float64 run's value
    baseline_error: float | None = None  # |baseline - reference| / |reference|
    candidate_error: float | None = None  # |candidate - reference| / |reference|
    allowed_error: float | None = None  # margin * baseline_error + rtol


@dataclass(frozen=True)
class ParityResult:
    passed: bool | None  # None: nothing could be compared
    num_steps: int
    tolerance: Tolerance
    checks: tuple[ParityCheck, ...]
    baseline_losses: tuple[float | None, ...]
    candidate_losses: tuple[float | None, ...]
    baseline_grad_norms: tuple[float | None, ...]
    candidate_grad_norms: tuple[float | None, ...]
    notes: tuple[str, ...] = ()
    rule: str = RULE_TOLERANCE  # float64-reference, tolerance, or mixed (each check says)
    reference_losses: tuple[float | None, ...] = ()
    reference_grad_norms: tuple[float | None, ...] = ()
    # why the fixed tolerance judged (declared exact, no float64 run and why); "" otherwise
    tolerance_reason: str = ""
    # after a failed gate, what running the baseline again showed (levers.ab.repeat); "" else
    repeat: str = ""


def is_low_precision(workload: Workload) -> bool:
    """Whether the weights are bf16/fp16: the ``dtype`` parameter, else the weights themselves.

    Autocast is seen separately, while the step runs (``precision.autocast_probe``).
    """
    declared = workload.params.get("dtype")
    if declared is not None:
        return str(declared).removeprefix("torch.") in _LOW_PRECISION_NAMES
    for param in workload.model.parameters():
        if param.is_floating_point():
            return param.dtype in (torch.bfloat16, torch.float16)
    return False


def tolerance_for(
    exactness: str,
    low_precision: bool,
    autocast: str | None = None,
    floor: float | None = None,
    floor_of: str = "",
) -> Tolerance:
    """The table's tolerance for ``exactness`` and the step's precision; ``floor``, the least
    tolerance that lever ``floor_of`` declares, raises both of its steps to at least that."""
    if exactness not in EXACTNESS:
        raise ValueError(f"exactness must be one of {EXACTNESS}, got {exactness!r}")
    first, last = RTOL[(exactness, low_precision)]
    if floor is None or exactness == EXACT or floor <= first and floor <= last:
        return Tolerance(exactness, low_precision, first, last, autocast)
    return Tolerance(
        exactness, low_precision, max(first, floor), max(last, floor), autocast,
        floor=floor, floor_of=floor_of,
    )


def rel_diff(baseline: float, candidate: float) -> float:
    if not (math.isfinite(baseline) and math.isfinite(candidate)):
        return math.inf if baseline != candidate or math.isnan(baseline) else 0.0
    scale = max(abs(baseline), abs(candidate))
    return 0.0 if scale == 0.0 else abs(candidate - baseline) / scale


def error_against(value: float, reference: float) -> float:
    """|value - reference| / |reference| (the absolute difference when the reference is 0)."""
    if not math.isfinite(value):
        return math.inf
    diff = abs(value - reference)
    return diff / abs(reference) if reference != 0.0 else diff


def _check(
    step: int, quantity: str, a: float | None, b: float | None, rtol: float, gating: bool
) -> ParityCheck:
    if a is None or b is None:
        return ParityCheck(step, quantity, a, b, None, rtol, None, gating)
    diff = rel_diff(a, b)
    return ParityCheck(step, quantity, a, b, diff, rtol, diff <= rtol, gating)


def reference_check(
    step: int, quantity: str, a: float | None, b: float | None, ref: float | None, floor: float
) -> ParityCheck:
    """The float64-reference rule; the fixed tolerance where this point has no reference value."""
    if ref is None or not math.isfinite(ref) or a is None or b is None:
        return _check(step, quantity, a, b, floor, True)
    error_a, error_b = error_against(a, ref), error_against(b, ref)
    if not math.isfinite(error_a):
        # a non-finite baseline would allow anything: hold the sides to each other instead
        return _check(step, quantity, a, b, floor, True)
    allowed = REFERENCE_MARGIN * error_a + floor
    return ParityCheck(
        step,
        quantity,
        a,
        b,
        rel_diff(a, b),
        floor,
        error_b <= allowed,
        True,
        rule=RULE_REFERENCE,
        reference=ref,
        baseline_error=error_a,
        candidate_error=error_b,
        allowed_error=allowed,
    )


def _param_check(
    baseline: Workload, candidate: Workload, step: int, rtol: float, gating: bool
) -> ParityCheck | None:
    """||theta_b - theta_a|| / ||theta_a|| over all parameters, if the models match by name."""
    params_a = dict(baseline.model.named_parameters())
    params_b = dict(candidate.model.named_parameters())
    if params_a.keys() != params_b.keys() or any(
        params_a[k].shape != params_b[k].shape for k in params_a
    ):
        return None
    diff_sq = norm_a_sq = norm_b_sq = 0.0
    with torch.no_grad():
        for name, a in params_a.items():
            a32 = a.float()
            b32 = params_b[name].to(a.device, torch.float32)
            diff_sq += float(torch.linalg.vector_norm(b32 - a32)) ** 2  # sync point
            norm_a_sq += float(torch.linalg.vector_norm(a32)) ** 2  # sync point
            norm_b_sq += float(torch.linalg.vector_norm(b32)) ** 2  # sync point
    norm_a = math.sqrt(norm_a_sq)
    diff = math.sqrt(diff_sq) / norm_a if norm_a > 0 else math.sqrt(diff_sq)
    return ParityCheck(
        step, "params", norm_a, math.sqrt(norm_b_sq), diff, rtol, diff <= rtol, gating
    )


def _as_float(value: torch.Tensor | float | None) -> float | None:
    return None if value is None else float(value)  # sync point (parity is never timed)


def run_parity(
    baseline: Workload,
    candidate: Workload,
    *,
    num_steps: int,
    exactness: str,
    seed: int,
    lines: KillLines,
    reference: Reference | None = None,
    floor: float | None = None,
    floor_of: str = "",
) -> tuple[ParityResult, Kill | None]:
    """Run ``num_steps`` steps of each side, compare, and return the evidence.

    ``reference`` is the float64 run of the same steps (:func:`reference_for`); without one, or
    for an ``exact`` candidate, the fixed tolerance judges. ``floor`` is the least tolerance the
    candidate's lever ``floor_of`` declares (:func:`tolerance_for`).
    """
    sides = (("baseline", baseline), ("candidate", candidate))
    losses: dict[str, list[float | None]] = {"baseline": [], "candidate": []}
    norms: dict[str, list[float | None]] = {"baseline": [], "candidate": []}
    device_type = torch.device(baseline.device).type
    with (
        autocast_probe(baseline.model, device_type) as autocast_a,
        autocast_probe(candidate.model, device_type) as autocast_b,
    ):
        kill = run_parity_steps(sides, num_steps, seed, lines, losses, norms)
        autocast = (autocast_a(), autocast_b())
    low_precision = (
        is_low_precision(baseline)
        or is_low_precision(candidate)
        or any(dtype in LOW_PRECISION for dtype in autocast)
    )
    seen = [str(dtype).removeprefix("torch.") for dtype in autocast if dtype is not None]
    tolerance = tolerance_for(
        exactness, low_precision, seen[0] if seen else None, floor, floor_of
    )
    if reference is None:
        reference = unavailable("no float64 run was made")
    result = judge(tolerance, losses, norms, num_steps, kill, reference, (baseline, candidate))
    return result, kill


def reference_for(
    build: Callable[[], Workload],
    *,
    num_steps: int,
    exactness: str,
    seed: int,
    lines: KillLines | None = None,
) -> tuple[Reference, Kill | None]:
    """The float64 run the gate judges a changes-numerics candidate against.

    ``build`` builds the baseline as the runner does (seeded). An ``exact`` candidate is held to
    the baseline directly, so it gets no reference (and costs none).
    """
    if exactness == EXACT:
        return unavailable(EXACT_REASON), None
    return run_reference(build, num_steps=num_steps, seed=seed, lines=lines)


def parity_gate(
    build_baseline: Callable[[], Workload],
    build_candidate: Callable[[], Workload],
    *,
    num_steps: int = 3,
    exactness: str = CHANGES_NUMERICS,
    seed: int = 0,
    lines: KillLines | None = None,
) -> ParityResult:
    """The parity gate alone, on fresh builds: for callers that only need to know whether a
    change keeps parity (``levers tune`` keeps only levers that do).

    Each build is called with the global RNG seeded to ``seed`` (same weights); the float64
    reference is built first and freed before the two sides. A kill (the time budget of
    ``lines``, a non-finite loss, a step that raises) ends the gate early; the result then holds
    what was compared and ``passed`` is False or None.
    """
    if num_steps < 1:
        raise ValueError(f"num_steps must be at least 1 for a parity gate, got {num_steps}")
    lines = lines or KillLines()

    def seeded(build: Callable[[], Workload]) -> Workload:
        torch.manual_seed(seed)
        return build()

    reference, kill = reference_for(
        lambda: seeded(build_baseline),
        num_steps=num_steps,
        exactness=exactness,
        seed=seed,
        lines=lines,
    )
    if kill is not None:
        raise KillSignal(kill)
    baseline, candidate = seeded(build_baseline), seeded(build_candidate)
    result, _ = run_parity(
        baseline,
        candidate,
        num_steps=num_steps,
        exactness=exactness,
        seed=seed,
        lines=lines,
        reference=reference,
    )
    return result


def run_parity_steps(
    sides,
    num_steps: int,
    seed: int,
    lines: KillLines,
    losses: dict[str, list[float | None]],
    norms: dict[str, list[float | None]],
) -> Kill | None:
    """The parity steps of ``sides`` (``(name, workload)`` pairs), alternating, the global RNG
    reseeded alike before each side's k-th step; fills ``losses`` and ``norms`` by side name.
    Returns the kill that stopped them (time budget, a non-finite loss, a step that raised)."""
    try:
        with ExitStack() as stack:
            takes = {side: stack.enter_context(grad_norm_probe(w.model)) for side, w in sides}
            for step in range(1, num_steps + 1):
                for side, workload in sides:
                    check_time(lines, "parity", side, step)
                    torch.manual_seed(seed + step)  # same batches and dropout on every side
                    loss = _as_float(run_step(workload, "parity", side, step, lines))
                    losses[side].append(loss)
                    norms[side].append(_as_float(takes[side]()))
                    check_loss(loss, "parity", side, step)
    except KillSignal as signal:
        return signal.kill
    return None


def judge(
    tolerance: Tolerance,
    losses: dict[str, list[float | None]],
    norms: dict[str, list[float | None]],
    num_steps: int,
    kill: Kill | None,
    reference: Reference,
    sides: tuple[Workload, Workload] | None = None,
) -> ParityResult:
    """The gate's verdict on the two sides' loss and gradient-norm series and, where the two
    workloads are given (``sides``), their parameters after the steps; without them (the sides
    ran one at a time and are freed) the parameters are not compared."""
    num_done = min(len(losses["baseline"]), len(losses["candidate"]))
    # no step completed on both sides (--parity-steps 0, or a kill in the first step): nothing
    # to compare
    checkpoints = sorted({1, num_done}) if num_done >= 1 else []
    by_reference = reference.available and tolerance.exactness != EXACT
    refs = {"loss": reference.losses, "grad_norm": reference.grad_norms}
    series = {"loss": losses, "grad_norm": norms}
    checks: list[ParityCheck] = []
    for step in checkpoints:
        rtol = tolerance.rtol_first if step == 1 else tolerance.rtol_last
        i = step - 1
        for quantity in ("loss", "grad_norm"):
            a, b = series[quantity]["baseline"][i], series[quantity]["candidate"][i]
            if by_reference:
                ref = refs[quantity][i] if i < len(refs[quantity]) else None
                checks.append(reference_check(step, quantity, a, b, ref, rtol))
            else:
                checks.append(_check(step, quantity, a, b, rtol, True))
    notes = []
    if num_done and kill is None and sides is None:
        notes.append("parameters not compared: the sides ran one at a time")
    elif num_done and kill is None:
        param_check = _param_check(
            *sides, num_done, tolerance.rtol_last, tolerance.exactness == EXACT
        )
        if param_check is None:
            notes.append("parameters not compared: the two models name or shape them differently")
        else:
            checks.append(param_check)
    if by_reference and reference.float32_ops:
        notes.append(
            f"the float64 run computed {', '.join(reference.float32_ops)} in float32 (no float64 "
            "kernel)"
        )
    if any(c.quantity == "loss" and c.passed is None for c in checks):
        notes.append("step() returned no loss: only gradient norms were compared")
    gating = [c.passed for c in checks if c.gating and c.passed is not None]
    passed = None if not gating else all(gating)
    if num_steps == 0:
        notes.append("the parity gate was skipped (--parity-steps 0)")
    judged = [c for c in checks if c.quantity != "params" and c.passed is not None]
    rules = {c.rule for c in judged}
    rule = RULE_MIXED if len(rules) > 1 else rules.pop() if rules else RULE_TOLERANCE
    if rule != RULE_TOLERANCE:
        tolerance = replace(tolerance, margin=REFERENCE_MARGIN)
    if rule == RULE_REFERENCE:
        why_tolerance = ""
    elif rule == RULE_MIXED:
        why_tolerance = "a side or the float64 run had no finite value at some check"
    elif tolerance.exactness == EXACT:
        why_tolerance = EXACT_REASON
    else:
        why_tolerance = reference.why_not or ""
    return ParityResult(
        passed=passed,
        num_steps=num_done,
        tolerance=tolerance,
        checks=tuple(checks),
        baseline_losses=tuple(losses["baseline"]),
        candidate_losses=tuple(losses["candidate"]),
        baseline_grad_norms=tuple(norms["baseline"]),
        candidate_grad_norms=tuple(norms["candidate"]),
        notes=tuple(notes),
        rule=rule,
        reference_losses=reference.losses,
        reference_grad_norms=reference.grad_norms,
        tolerance_reason=why_tolerance,
    )


def parity_from_dict(document: dict[str, Any]) -> ParityResult:
    """A ParityResult from its JSON form (``result["parity"]`` of a record line or ``--json``).

    Records written before the float64 reference existed lack its fields; they read as judged
    by the fixed tolerance, which is what judged them.
    """
    tol = dict(document["tolerance"])
    tol["exactness"] = fix_safety(tol["exactness"])
    tolerance = Tolerance(**{k: v for k, v in tol.items() if k in _fields(Tolerance)})
    checks = tuple(
        ParityCheck(**{k: v for k, v in c.items() if k in _fields(ParityCheck)})
        for c in document.get("checks", ())
    )
    sequences = (
        "baseline_losses",
        "candidate_losses",
        "baseline_grad_norms",
        "candidate_grad_norms",
        "notes",
        "reference_losses",
        "reference_grad_norms",
    )
    plain = {
        k: v
        for k, v in document.items()
        if k in _fields(ParityResult) and k not in ("tolerance", "checks", *sequences)
    }
    return ParityResult(
        tolerance=tolerance,
        checks=checks,
        **plain,
        **{k: tuple(document.get(k, ())) for k in sequences},
    )


def _fields(cls: type) -> set[str]:
    return {f.name for f in fields(cls)}
