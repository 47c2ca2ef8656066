"""The real measurement behind ``levers tune``: each trial is one ``levers ab`` comparison.

The two sides are built as ``levers ab`` builds them (:func:`levers.ab.design.sides`, so the
parameters, the seed and the levers' options are the same), and compared by
:func:`levers.ab.runner.run_ab`: its parity gate, warm-up, alternating timed steps, paired
bootstrap CI95 and quality read. An increment (``stack + [lever]`` against ``stack``) builds its
baseline side as the candidate of a design with ``stack``; a trial against the baseline is
exactly ``levers ab WORKLOAD --lever STACK``.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch

from levers.ab import design as design_mod
from levers.ab.killlines import KillLines
from levers.ab.parity import reference_for
from levers.ab.runner import AbConfig, run_ab
from levers.errors import LeversError
from levers.tune.trial import Measure, Stack, Trial, failed, from_ab
from levers.vocab import CHANGES_NUMERICS

# per trial: short enough that a budget of minutes holds several, long enough for a CI95
DEFAULT_STEPS = 20
DEFAULT_WARMUP = 3
DEFAULT_PARITY_STEPS = 3
DEFAULT_RESAMPLES = 2_000


@dataclass(frozen=True)
class TrialDesign:
    """The A/B design every trial of one search shares (recorded with the result)."""

    steps: int = DEFAULT_STEPS
    warmup: int = DEFAULT_WARMUP
    parity_steps: int = DEFAULT_PARITY_STEPS
    resamples: int = DEFAULT_RESAMPLES
    seed: int = 0

    def __post_init__(self) -> None:
        # the same checks ab applies, before the search starts (the fields are design keys)
        AbConfig.from_design(asdict(self))


def _design(spec: str, params: dict[str, Any], stack: Stack, design: TrialDesign) -> dict:
    given = {"baseline": spec, "params": dict(params), "levers": list(stack), **asdict(design)}
    resolved, _ = design_mod.resolve(given, {}, None)
    return resolved


def ab_measure(
    spec: str, params: dict[str, Any], design: TrialDesign = TrialDesign(), sides: str = "together",
    window_s: float | None = None,
) -> Measure:
    """A :data:`levers.tune.trial.Measure` that runs ab on the workload ``spec`` (a built-in,
    a file or module factory) with ``params``, its sides ``together`` or ``one-at-a-time``
    (:class:`levers.ab.runner.AbConfig`). Its timed steps run the programs its parity steps
    compiled (one compile per compiled stack, its trial saying where random numbers were drawn
    as eager draws them), except with ``as_run=True``: compiled again, as the user runs them.

    The float64 run the parity gate judges by is the workload's own (a lever is to keep its
    math): it is made once, by the first trial, and every later trial of the search reuses it
    rather than building and running it again.
    """
    shared: dict[str, Any] = {}  # "reference": the workload's float64 run, once made

    def measure(
        base: Stack, stack: Stack, time_budget_s: float | None, *, steps: int | None = None,
        as_run: bool = False,
    ) -> Trial:
        started = time.perf_counter()
        chosen = design if steps is None else replace(design, steps=steps)
        try:
            candidate_design = _design(spec, params, stack, chosen)
            baseline_side, candidate_side, exactness = design_mod.sides(candidate_design)
            reference_s = 0.0
            if "reference" not in shared:
                reference, killed = _reference(baseline_side, design, time_budget_s)
                reference_s = time.perf_counter() - started
                if killed is not None:
                    return _killed(base, stack, killed, reference_s)
                shared["reference"] = reference
            if base:
                _, baseline_side, _ = design_mod.sides(_design(spec, params, base, chosen))
            left_s = None if not time_budget_s else max(time_budget_s - reference_s, 1e-3)
            kill = {"time_budget_s": left_s} if left_s else {}
            # the timed steps run what the parity steps compiled: on a model that draws random
            # numbers a compiled stack costs one compile, not two (T5 on an H100: ~95 s each, two
            # over a 3-minute budget); the trial says so (Trial.timed_eager_random)
            # and they stop at an interim look that finds the ratio decided (levers.ab.looks):
            # a confirmation asked for five times the steps rarely needs them all
            config = replace(design_mod.config(candidate_design, kill, exactness, sides),
                             time_parity_programs=not as_run, stop_when_decided=True)
            if window_s is not None:
                config = replace(config, window_s=window_s)
            result = run_ab(baseline_side, candidate_side, config, shared["reference"])
        except LeversError as exc:  # a lever that does not apply on top of the stack, say
            return failed(base, stack, _one_line(exc), time.perf_counter() - started)
        except Exception as exc:  # noqa: BLE001 - a lever that breaks this model is an answer
            return failed(
                base, stack, f"the stack raised {type(exc).__name__}: {_one_line(exc)}",
                time.perf_counter() - started,
            )
        trial = from_ab(base, stack, result)
        if reference_s:
            phases = {"reference": round(reference_s, 3), **trial.phase_s}
            trial = replace(trial, phase_s=phases, wall_s=trial.wall_s + reference_s)
        return trial

    return measure


def _reference(side: Any, design: TrialDesign, time_budget_s: float | None) -> tuple[Any, Any]:
    """The workload's float64 run of the parity steps (or why there is none), and a kill."""
    def build() -> Any:
        torch.manual_seed(design.seed)  # as ab's runner builds a side
        return side.build()

    lines = KillLines(time_budget_s=time_budget_s or None, started_s=time.perf_counter())
    return reference_for(
        build, num_steps=design.parity_steps, exactness=CHANGES_NUMERICS, seed=design.seed,
        lines=lines,
    )


def _killed(base: Stack, stack: Stack, kill: Any, wall_s: float) -> Trial:
    return Trial(
        base=base, stack=stack, decision="KILLED", killed=kill.reason, killed_kind=kill.kind,
        wall_s=wall_s,
    )


def remembered(measure: Measure, memory: dict[tuple[Stack, Stack], Trial]) -> Measure:
    """``measure`` that answers an A/B it already ran from ``memory`` (one Step's audit and
    tune share their trials: the audit's measured claims are tune's first increments). A trial
    the time budget or a Ctrl-C cut short is run again, not remembered; one asked for its own
    ``steps`` (the search's confirmation, which must select nothing) is always run afresh."""

    def measure_once(
        base: Stack, stack: Stack, time_budget_s: float | None, *, steps: int | None = None,
        as_run: bool = False,
    ) -> Trial:
        if as_run:
            return measure(base, stack, time_budget_s, steps=steps, as_run=True)
        if steps is not None:
            return measure(base, stack, time_budget_s, steps=steps)
        key = (tuple(base), tuple(stack))
        if key in memory:
            return memory[key]
        trial = measure(base, stack, time_budget_s)
        if not (trial.out_of_time or trial.interrupted):
            memory[key] = trial
        return trial

    return measure_once


def _one_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
