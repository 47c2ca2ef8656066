"""The parity gate: does the candidate compute the same training step as the baseline?

Both sides are built from the same seed (same weights), and the global RNG is reseeded to the
same value before each side's k-th parity step (same random batches, same dropout masks). After
step 1 and after step K the gate compares the loss and the total gradient norm; after step K it
also compares the parameters when both models name and shape them alike. Tolerances are
relative and depend on the declared exactness of the change and on the compute dtype:

- ``exact``: the change must not alter the math; only non-deterministic kernels may differ.
  Parameter differences gate too.
- ``changes-numerics``: rounding may differ (fused kernels, other reduction orders).
  Parameter differences are reported as evidence but do not gate, since Adam-like optimizers
  turn rounding noise in near-zero gradients into full-size updates.

The parity steps run on the same objects that are timed afterwards, before any timing: both
sides then enter warm-up having taken the same number of steps (so lazily created optimizer
state exists on both), and any divergence of their weights is within the tolerance checked here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from levers.ab.gradnorm import grad_norm_probe
from levers.ab.killlines import Kill, KillLines, KillSignal, check_loss, check_time
from levers.ab.precision import LOW_PRECISION, autocast_probe
from levers.ab.steps import run_step
from levers.workload import Workload
from levers.vocab import CHANGES_NUMERICS, EXACT, FIX_SAFETIES

EXACTNESS = FIX_SAFETIES

# (exactness, low precision) -> relative tolerance (after step 1, after step K)
RTOL = {
    (EXACT, False): (1e-6, 1e-5),
    (EXACT, True): (1e-3, 1e-2),
    (CHANGES_NUMERICS, False): (1e-4, 1e-3),
    (CHANGES_NUMERICS, True): (1e-2, 2e-2),
}

_LOW_PRECISION_NAMES = {"bf16", "bfloat16", "fp16", "float16", "half"}


@dataclass(frozen=True)
class Tolerance:
    exactness: str
    low_precision: bool
    rtol_first: float  # after step 1
    rtol_last: float  # after step K
    autocast: str | None = None  # the autocast dtype seen in the step ("bfloat16"), if any


@dataclass(frozen=True)
class ParityCheck:
    """One compared quantity at one step, with the numbers."""

    step: int
    quantity: str  # "loss", "grad_norm", "params"
    baseline: float | None  # for "params": the L2 norm of all of that side's parameters
    candidate: float | None
    rel_diff: float | None  # |candidate - baseline| / max(|.|); for "params" ||b - a|| / ||a||
    rtol: float
    passed: bool | None  # None: could not be compared
    gating: bool  # False: reported as evidence only


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


def tolerance_for(exactness: str, low_precision: bool, autocast: str | None = None) -> Tolerance:
    if exactness not in EXACTNESS:
        raise ValueError(f"exactness must be one of {EXACTNESS}, got {exactness!r}")
    first, last = RTOL[(exactness, low_precision)]
    return Tolerance(exactness, low_precision, first, last, autocast)


def rel_diff(baseline: float, candidate: float) -> float:
    if not (math.isfinite(baseline) and math.isfinite(candidate)):
        return math.inf if baseline != candidate or math.isnan(baseline) else 0.0
    scale = max(abs(baseline), abs(candidate))
    return 0.0 if scale == 0.0 else abs(candidate - baseline) / scale


def _check(
    step: int, quantity: str, a: float | None, b: float | None, rtol: float, gating: bool
) -> ParityCheck:
    if a is None or b is None:
        return ParityCheck(step, quantity, a, b, None, rtol, None, gating)
    diff = rel_diff(a, b)
    return ParityCheck(step, quantity, a, b, diff, rtol, diff <= rtol, gating)


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
) -> tuple[ParityResult, Kill | None]:
    """Run ``num_steps`` steps of each side, compare, and return the evidence."""
    sides = (("baseline", baseline), ("candidate", candidate))
    losses: dict[str, list[float | None]] = {"baseline": [], "candidate": []}
    norms: dict[str, list[float | None]] = {"baseline": [], "candidate": []}
    device_type = torch.device(baseline.device).type
    with (
        autocast_probe(baseline.model, device_type) as autocast_a,
        autocast_probe(candidate.model, device_type) as autocast_b,
    ):
        kill = _steps(sides, num_steps, seed, lines, losses, norms)
        autocast = (autocast_a(), autocast_b())
    low_precision = (
        is_low_precision(baseline)
        or is_low_precision(candidate)
        or any(dtype in LOW_PRECISION for dtype in autocast)
    )
    seen = [str(dtype).removeprefix("torch.") for dtype in autocast if dtype is not None]
    tolerance = tolerance_for(exactness, low_precision, seen[0] if seen else None)
    result = _judge(baseline, candidate, tolerance, losses, norms, num_steps, kill)
    return result, kill


def _steps(
    sides,
    num_steps: int,
    seed: int,
    lines: KillLines,
    losses: dict[str, list[float | None]],
    norms: dict[str, list[float | None]],
) -> Kill | None:
    """The parity steps of both sides, alternating; fills ``losses`` and ``norms``."""
    (_, baseline), (_, candidate) = sides
    try:
        with grad_norm_probe(baseline.model) as take_a, grad_norm_probe(candidate.model) as take_b:
            takes = {"baseline": take_a, "candidate": take_b}
            for step in range(1, num_steps + 1):
                for side, workload in sides:
                    check_time(lines, "parity", side, step)
                    torch.manual_seed(seed + step)  # same batches and dropout on both sides
                    loss = _as_float(run_step(workload, "parity", side, step))
                    losses[side].append(loss)
                    norms[side].append(_as_float(takes[side]()))
                    check_loss(loss, "parity", side, step)
    except KillSignal as signal:
        return signal.kill
    return None


def _judge(
    baseline: Workload,
    candidate: Workload,
    tolerance: Tolerance,
    losses: dict[str, list[float | None]],
    norms: dict[str, list[float | None]],
    num_steps: int,
    kill: Kill | None,
) -> ParityResult:
    num_done = min(len(losses["baseline"]), len(losses["candidate"]))
    checkpoints = sorted({s for s in (1, num_done) if s >= 1})
    checks: list[ParityCheck] = []
    for step in checkpoints:
        rtol = tolerance.rtol_first if step == 1 else tolerance.rtol_last
        i = step - 1
        checks.append(
            _check(step, "loss", losses["baseline"][i], losses["candidate"][i], rtol, True)
        )
        checks.append(
            _check(step, "grad_norm", norms["baseline"][i], norms["candidate"][i], rtol, True)
        )
    notes = []
    if num_done and kill is None:
        param_check = _param_check(
            baseline, candidate, num_done, tolerance.rtol_last, tolerance.exactness == "exact"
        )
        if param_check is None:
            notes.append("parameters not compared: the two models name or shape them differently")
        else:
            checks.append(param_check)
    if any(c.quantity == "loss" and c.passed is None for c in checks):
        notes.append("step() returned no loss: only gradient norms were compared")
    gating = [c.passed for c in checks if c.gating and c.passed is not None]
    passed = None if not gating else all(gating)
    if num_steps == 0:
        notes.append("the parity gate was skipped (--parity-steps 0)")
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
    )
