"""``levers tune -- python train.py``: the search of :mod:`levers.tune.search` on an unchanged
script.

A factory can build its workload again for each side of an A/B; a script builds its model as it
runs. So each A/B here is one run of the script in a fresh process (``python -m
levers.cli.script_trial``) in which the two sides take turns: after the script's first optimizer
steps the candidate's levers are applied in-process, its parity steps, warm-up and timed steps
run, the levers are undone and the baseline's window runs, and again in the other order (C B B C
for two rounds); the process writes what it saw as JSON (:mod:`levers.integrations.script_trial`).
This module starts those runs and compares what they saw:

- **Before the search**, one run without levers (the *probe*), as long as an A/B's, finds the
  model from the optimizer, says which levers apply to it inside the script, the precision the
  step computes in and whether the model's forward draws random numbers, and (unless
  ``--no-audit``) audits one step for the levers' expected savings; a second run without levers,
  to the end of the parity steps only, checks that the script's steps repeat. A script that
  fails or ends before an A/B's last step, or whose loss is NaN or infinite at a step of it, is
  refused here, before the search.
- **Each A/B** pairs the j-th timed step of the candidate's window ``r`` with the j-th of the
  baseline's window ``r`` (each pair of windows in the other order from the one before, so that
  a drift of the step time over the run falls on both sides alike); ab's paired bootstrap
  (:func:`levers.ab.stats.paired_ratio_ci`) gives the CI95 of the step-time ratio and of the
  tokens/s ratio (read as steps/s: both sides run the script's own batches, the same tokens per
  step, since no lever that changes the batch is tried) and tune's
  :func:`levers.tune.trial.judge` decides. An A/B so pays one start of the script (its imports,
  model, data, compile) instead of one per side and round. A NaN or infinite loss at any step of
  either side stops the run there and kills the A/B (ab's kill line): nothing is judged on it.
- **Parity**: the losses of the candidate's parity steps (script steps ``W+1 .. W+P``, the first
  after its levers are applied) are compared with the probe's losses of the same steps within
  the tolerance of the candidate's whole stack (the user's question is whether this stack keeps
  the script's results): ab's fixed tolerance for the levers' declared safety and the step's
  precision (:func:`levers.ab.parity.tolerance_for`, with a lever's declared parity floor), or
  the levers' declared tolerance where that is looser. An increment's baseline side (the stack
  kept so far) is only timed: its own parity was proven when it was kept. This needs steps that
  repeat: when the two runs without levers differ beyond the tolerance at a compared step (an
  unseeded script, nondeterministic data order), parity is "not checked: the script's steps are
  not repeatable", never PARITY, and so nothing is kept (judge keeps a lever only with parity
  held). When they differ beyond even the loosest tolerance, no A/B is run and the result says
  why.
- **Peak memory**: the CUDA allocator's peak over each window's timed steps; not measured on a
  CPU.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from statistics import median
from typing import Any, Protocol

from levers.levers.lever import lever_id_of
import levers
from levers.ab.parity import Tolerance, rel_diff, tolerance_for
from levers.ab.runner import MIN_STEPS_FOR_CI
from levers.ab.stats import paired_ratio_ci
from levers.ab.verdict import (
    DAMAGED,
    KILLED,
    NOT_MEASURED,
    PARITY,
    decision,
    memory_verdict,
    ratio_verdict,
)
from levers.errors import LeversError, StepError
from levers.levers import load_all
from levers.tune.candidates import Skipped, candidates
from levers.tune.measure import TrialDesign
from levers.tune.options import TuneOptions
from levers.tune.result import TuneResult
from levers.tune.run import catalogue_rows, gpu_only_note, record_result, record_trials
from levers.tune.search import Outcome, SearchResult, search
from levers.tune.trial import Measure, Stack, Trial, failed
from levers.vocab import CHANGES_NUMERICS, EXACT

DEFAULT_ROUNDS = 2
# the script's own optimizer steps before the levers are applied (its data workers, allocator
# growth and lazily created optimizer state come first, as for the audit's capture)
SCRIPT_WARMUP = 2
TRIAL_MODULE = "levers.cli.script_trial"  # its command line; the run: integrations.script_trial
NOT_REPEATABLE = "not checked: the script's steps are not repeatable"
CANDIDATE = "candidate"  # the sides' names in the run's JSON (integrations.script_trial)
BASELINE = "baseline"
_LOG_TAIL_LINES = 15


@dataclass(frozen=True)
class ScriptDesign:
    """How each run of the script is laid out; ``trial`` is the design every A/B shares."""

    trial: TrialDesign = TrialDesign()
    rounds: int = DEFAULT_ROUNDS
    script_warmup: int = SCRIPT_WARMUP

    def __post_init__(self) -> None:
        if self.rounds < 1:
            raise ValueError(f"--rounds must be at least 1, got {self.rounds}")

    @property
    def timed_per_window(self) -> int:
        return math.ceil(self.trial.steps / self.rounds)

    @property
    def steps_per_run(self) -> int:
        """The optimizer steps the run of an A/B (and the probe) must reach, as
        :func:`levers.integrations.script_trial.window_plan` lays them out: the parity steps,
        ``2 x rounds`` windows of the timed steps, and ``--warmup`` untimed steps at the start of
        the first window and after each of the ``rounds`` switches of side (C B B C)."""
        return (
            self.script_warmup + self.trial.parity_steps
            + (self.rounds + 1) * self.trial.warmup + 2 * self.rounds * self.timed_per_window
        )

    def steps_that_fit(self, num_steps: int) -> int | None:
        """The largest ``--steps`` whose runs end by the script's optimizer step ``num_steps``,
        the rest of the design as it is; None where that leaves fewer than ab's
        ``MIN_STEPS_FOR_CI`` timed steps per side (a CI95 too wide to trust)."""
        trial = self.trial
        untimed = self.script_warmup + trial.parity_steps + (self.rounds + 1) * trial.warmup
        steps = (num_steps - untimed) // (2 * self.rounds) * self.rounds
        return steps if steps >= MIN_STEPS_FOR_CI else None

    @property
    def repeat_steps(self) -> int:
        """The optimizer steps the repeat check must reach: to the end of the parity steps."""
        return self.script_warmup + self.trial.parity_steps

    def layout(self) -> str:
        return (
            f"{self.script_warmup} before the levers are applied, --parity-steps "
            f"{self.trial.parity_steps}, then {self.rounds} pair(s) of windows of "
            f"{self.timed_per_window} timed steps (--steps {self.trial.steps} over --rounds "
            f"{self.rounds}), each side's first window after a switch starting with --warmup "
            f"{self.trial.warmup}"
        )


@dataclass(frozen=True)
class Window:
    """One window of a run, as its process wrote it: one side's levers on, its timed steps."""

    side: str
    stack: Stack
    step_s: tuple[float, ...] = ()
    peak_allocated_bytes: int | None = None


@dataclass(frozen=True)
class TrialRun:
    """One run of the script (one process), as it wrote it (``data`` is the whole document).

    ``parity_losses`` are the losses of script steps ``W+1 .. W+P`` (the candidate's, or the
    steps without levers of a run that applies none)."""

    complete: bool
    windows: tuple[Window, ...] = ()
    parity_losses: tuple[float | None, ...] = ()
    error: str | None = None
    failed_side: str | None = None
    timed_out: bool = False
    log_tail: str = ""
    data: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_document(cls, data: Mapping[str, Any], log_tail: str = "") -> TrialRun:
        windows = tuple(
            Window(
                side=w["side"], stack=tuple(w.get("stack") or ()),
                step_s=tuple(w.get("step_s") or ()),
                peak_allocated_bytes=w.get("peak_allocated_bytes"),
            )
            for w in data.get("windows") or ()
        )
        return cls(
            complete=bool(data.get("complete")),
            windows=windows,
            parity_losses=tuple(data.get("parity_losses") or ()),
            error=data.get("error"),
            failed_side=data.get("failed_side"),
            log_tail=log_tail,
            data=dict(data),
        )

    def of_side(self, side: str) -> list[Window]:
        return [w for w in self.windows if w.side == side]


class RunScript(Protocol):
    """One run of the script: ``candidate``'s windows alternating with ``baseline``'s, ``rounds``
    pairs of them (None: the design's; 0: the parity steps alone)."""

    def __call__(
        self, candidate: Stack, baseline: Stack, timeout_s: float | None, *,
        rounds: int | None = None, probe: bool = False, audit: bool = False,
        draws_random: bool | None = None,
    ) -> TrialRun: ...


def _levers_path() -> str:
    """The directory this levers package is imported from, for the child's ``sys.path``."""
    return str(Path(levers.__file__).resolve().parents[1])


def _tail(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-_LOG_TAIL_LINES:])


@dataclass
class ProcessRunner:
    """A :class:`RunScript` that runs ``command`` (``python train.py ...``) in a fresh process
    per call; its output goes to a log in ``workdir`` (its last lines come back on failure).
    ``launched`` holds the command line of each process started."""

    command: Sequence[str]
    design: ScriptDesign
    workdir: Path
    launched: list[list[str]] = field(default_factory=list)

    def argv(
        self, candidate: Stack, baseline: Stack, out: Path, *, rounds: int | None = None,
        probe: bool = False, audit: bool = False, draws_random: bool | None = None,
    ) -> list[str]:
        design = self.design
        return [
            sys.executable, "-m", TRIAL_MODULE, "--out", str(out),
            "--candidate", ",".join(candidate), "--baseline", ",".join(baseline),
            "--warmup", str(design.script_warmup),
            "--parity-steps", str(design.trial.parity_steps),
            "--compile-steps", str(design.trial.warmup),
            "--steps", str(design.timed_per_window),
            "--rounds", str(design.rounds if rounds is None else rounds),
            *([] if draws_random is None else
              ["--draws-random", "yes" if draws_random else "no"]),
            *(["--probe"] if probe else []), *(["--audit"] if audit else []),
            "--", *self.command,
        ]

    def __call__(
        self, candidate: Stack, baseline: Stack, timeout_s: float | None, *,
        rounds: int | None = None, probe: bool = False, audit: bool = False,
        draws_random: bool | None = None,
    ) -> TrialRun:
        number = len(self.launched) + 1
        out = self.workdir / f"run-{number}.json"
        log = self.workdir / f"run-{number}.log"
        argv = self.argv(candidate, baseline, out, rounds=rounds, probe=probe, audit=audit,
                         draws_random=draws_random)
        self.launched.append(argv)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (_levers_path(), env.get("PYTHONPATH")) if p
        )
        with open(log, "wb") as log_file:
            # its own session: a timeout ends the script's data workers with it
            proc = subprocess.Popen(
                argv, stdout=log_file, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                _kill(proc)
                return TrialRun(complete=False, timed_out=True, log_tail=_tail(log),
                                error=f"the run did not end within {timeout_s:.0f} s")
            except BaseException:
                _kill(proc)
                raise
        if not out.is_file():
            return TrialRun(complete=False, log_tail=_tail(log), error=(
                f"the run's process exited with {proc.returncode} before it wrote its result"
            ))
        return TrialRun.from_document(json.loads(out.read_text()), _tail(log))


def subprocess_runner(command: Sequence[str], design: ScriptDesign, workdir: Path) -> ProcessRunner:
    """The runs of ``command``, each a fresh process (see :class:`ProcessRunner`)."""
    return ProcessRunner(list(command), design, Path(workdir))


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


# --- before the search: the probe and the repeat check --------------------------------------


def checked_baseline(run: TrialRun, display: str, design: ScriptDesign, needed: int) -> TrialRun:
    """``run`` (a run without levers, which must reach optimizer step ``needed``) when it
    recorded every step; else the error that says why levers tune cannot run this script."""
    if run.complete:
        return run
    data = run.data
    seen = data.get("num_steps", 0)
    log = f"\nits last lines:\n{run.log_tail}" if run.log_tail else ""
    bad = data.get("nonfinite")
    if bad:
        raise LeversError(
            f"{display}: the loss passed to backward() is {bad['loss']} at optimizer step "
            f"{bad['step']} of the script, with no lever applied; levers tune judges a lever "
            "on the script's losses and step times, which mean nothing on a run that trains on "
            "NaN or inf: fix the script's loss (its data, learning rate, precision) first"
        )
    if run.timed_out:
        raise LeversError(
            f"{display} did not reach its optimizer step {needed} within the budget; raise "
            f"--budget or lower --steps, --warmup and --rounds (each A/B runs it to step "
            f"{design.steps_per_run}: {design.layout()}){log}"
        )
    if data.get("exit_code") == 0 and data.get("script_error") is None and seen < needed:
        fits = design.steps_that_fit(seen) if needed == design.steps_per_run else None
        lower = (
            f", or fit the runs to its {seen} steps with --steps {fits}" if fits is not None
            else f" (--steps alone cannot fit the runs to its {seen} steps: that would time "
            f"fewer than {MIN_STEPS_FOR_CI} steps per side, too few for a CI95 to trust)"
        )
        raise LeversError(
            f"{display} ended after {seen} optimizer step(s); levers tune runs it to its "
            f"optimizer step {needed} each time ({design.layout()}): let the script run at "
            f"least {needed} optimizer steps (its own steps argument){lower}"
        )
    raise StepError(
        f"{display} failed before levers tune could time its steps (after {seen} optimizer "
        f"step(s)): {run.error}; run it on its own to check that it trains{log}"
    )


def repeat_differences(
    first: Sequence[float | None], second: Sequence[float | None]
) -> list[float | None]:
    """Per step, the relative difference of two runs' losses (None: no loss seen)."""
    return [None if a is None or b is None else rel_diff(a, b) for a, b in zip(first, second)]


# --- one A/B ---------------------------------------------------------------------------------


def stack_tolerance(
    levers: Sequence[str], registry: Mapping[str, Any], low_precision: bool,
    autocast: str | None,
) -> Tolerance:
    """The tolerance the losses of ``levers`` are held to: ab's fixed tolerance for their
    declared safety and the step's precision (raised to a lever's declared parity floor), or
    their declared tolerance where looser."""
    chosen = [registry[lever_id_of(lever)] for lever in levers]
    exact = all(lever.safety == EXACT for lever in chosen)
    floors = [(lever.parity_floor, lever.id) for lever in chosen if lever.parity_floor]
    floor, floor_of = max(floors) if floors else (None, "")
    tolerance = tolerance_for(
        EXACT if exact else CHANGES_NUMERICS, low_precision, autocast, floor, floor_of
    )
    declared = max((lever.tolerance or 0.0 for lever in chosen), default=0.0)
    return replace(
        tolerance,
        rtol_first=max(tolerance.rtol_first, declared),
        rtol_last=max(tolerance.rtol_last, declared),
    )


def _rtol(tolerance: Tolerance, index: int) -> float:
    return tolerance.rtol_first if index == 0 else tolerance.rtol_last


def script_parity(
    reference: Sequence[float | None],
    candidate: Sequence[float | None],
    repeat: Sequence[float | None],
    tolerance: Tolerance,
    *,
    num_steps: int,
    first_step: int,
) -> tuple[str, str]:
    """(verdict, note): the first ``num_steps`` losses of the candidate against the
    ``reference`` (the same script steps without levers). ``repeat`` is how far two runs without
    levers differ, per step; ``first_step`` is the script's step number of the first loss."""
    repeat = list(repeat)[:num_steps] + [None] * max(num_steps - len(repeat), 0)
    for losses in (reference, candidate):
        missing = [i for i in range(num_steps) if i >= len(losses) or losses[i] is None]
        if missing:
            return NOT_MEASURED, (
                f"not checked: levers saw no scalar loss passed to backward() in step "
                f"{first_step + missing[0]} of the script"
            )
    for i, diff in enumerate(repeat):
        if diff is not None and diff > _rtol(tolerance, i):
            return NOT_MEASURED, (
                f"{NOT_REPEATABLE} (two runs of it without levers differ by {diff:.3g} in the "
                f"loss of step {first_step + i}, tolerance {_rtol(tolerance, i):g}); seed the "
                "script (torch.manual_seed, the data order) so that its runs repeat"
            )
    largest = 0.0
    for i in range(num_steps):
        base, cand = reference[i], candidate[i]
        assert base is not None and cand is not None  # checked above
        diff = rel_diff(base, cand)
        if diff > _rtol(tolerance, i):
            return DAMAGED, (
                f"the loss of step {first_step + i} of the script differs by {diff:.3g} "
                f"({cand:.6g} against {base:.6g}; tolerance {_rtol(tolerance, i):g}, "
                f"{tolerance.exactness})"
            )
        largest = max(largest, diff)
    own = max((d for d in repeat if d is not None), default=0.0)
    last = first_step + num_steps - 1
    steps = f"step {first_step}" if num_steps == 1 else f"steps {first_step}-{last}"
    return PARITY, (
        f"the losses of {steps} of the script agree within {tolerance.rtol_last:g} "
        f"({tolerance.exactness}; largest difference {largest:.3g}, two runs without levers "
        f"{own:.3g})"
    )


def paired_steps(run: TrialRun) -> tuple[list[float], list[float]]:
    """(baseline, candidate) step times, pair ``(r, j)`` the j-th timed step of window ``r`` of
    each side (a window cut short pairs only the steps both sides have)."""
    base_s: list[float] = []
    cand_s: list[float] = []
    for cand, base in zip(run.of_side(CANDIDATE), run.of_side(BASELINE)):
        pairs = min(len(cand.step_s), len(base.step_s))
        cand_s += cand.step_s[:pairs]
        base_s += base.step_s[:pairs]
    return base_s, cand_s


def trial_from_run(
    base: Stack,
    stack: Stack,
    run: TrialRun,
    parity: tuple[str, str],
    design: ScriptDesign,
    wall_s: float,
) -> Trial:
    """The :class:`Trial` the windows of one run say."""
    trial = design.trial
    base_s, cand_s = paired_steps(run)
    if not base_s:
        return failed(base, stack, "the run of the script timed no step of both sides", wall_s)
    ci = dict(num_resamples=trial.resamples, seed=trial.seed)
    step_ci = paired_ratio_ci(base_s, cand_s, **ci)
    rate_ci = paired_ratio_ci([1 / t for t in base_s], [1 / t for t in cand_s], **ci)
    base_peaks = [w.peak_allocated_bytes for w in run.of_side(BASELINE)]
    cand_peaks = [w.peak_allocated_bytes for w in run.of_side(CANDIDATE)]
    peaks = None
    peak_verdict = NOT_MEASURED
    if all(p for p in (*base_peaks, *cand_peaks)):
        peaks = (median(base_peaks), median(cand_peaks))
        if len(base_peaks) >= 2:
            peak_verdict = memory_verdict(paired_ratio_ci(base_peaks, cand_peaks, **ci))
    verdicts = {
        "step_time": ratio_verdict(step_ci, "lower"),
        "tokens_per_s": ratio_verdict(rate_ci, "higher"),
        "peak_allocated": peak_verdict,
        "parity": parity[0],
    }
    windows = len(run.of_side(CANDIDATE))
    warnings = [
        f"one run of the script, {windows} window(s) of each side alternating (candidate "
        f"first); {len(base_s)} paired steps; tokens/s read as steps/s (the script's own batches "
        "on both sides)"
    ]
    random = run.data.get("random") or {}
    if random.get("recompiled"):
        warnings.append(
            "the parity steps drew random numbers as eager does (inductor's fallback_random); "
            "what was compiled then was compiled again before the timed steps"
        )
    return Trial(
        base=base,
        stack=stack,
        decision=decision(verdicts),
        tokens_per_s_ratio=rate_ci.ratio,
        tokens_per_s_ci95=(rate_ci.lo, rate_ci.hi),
        step_time_ratio=step_ci.ratio,
        step_time_ci95=(step_ci.lo, step_ci.hi),
        parity=parity[0],
        parity_note=parity[1],
        step_ms=(median(base_s) * 1e3, median(cand_s) * 1e3),
        peak_allocated_bytes=peaks,
        peak_verdict=peak_verdict,
        wall_s=wall_s,
        warnings=tuple(warnings),
        phase_s=_phases(run, wall_s),
    )


def _phases(run: TrialRun, wall_s: float) -> dict[str, float]:
    """Where the A/B's time went: the script's start to its first levers (imports, model, data,
    its first steps), the parity steps, the windows; the rest is the process's own start and
    end."""
    phases = {k: float(v) for k, v in (run.data.get("phase_s") or {}).items()}
    if phases:
        phases["process"] = max(wall_s - sum(phases.values()), 0.0)
    return phases


def script_measure(
    run_script: RunScript,
    design: ScriptDesign,
    *,
    reference: Sequence[float | None],
    tolerance_of: Callable[[Stack], Tolerance],
    repeat: Sequence[float | None] = (),
    draws_random: bool | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Measure:
    """A :data:`levers.tune.trial.Measure` over runs of the script: one run per A/B, its sides in
    alternating windows; ``reference`` is the losses of the parity steps without levers,
    ``tolerance_of(stack)`` the parity tolerance of a candidate stack."""

    def measure(base: Stack, stack: Stack, time_budget_s: float | None, **_: Any) -> Trial:
        started = clock()
        if time_budget_s is not None and time_budget_s <= 0:
            return _out_of_time(base, stack, 0.0)
        run = run_script(stack, base, time_budget_s, draws_random=draws_random)
        wall_s = clock() - started
        if run.timed_out:
            return _out_of_time(base, stack, wall_s)
        if run.data.get("nonfinite"):
            return _nonfinite(base, stack, run, wall_s)
        if not run.complete:
            if run.failed_side == BASELINE:  # after the candidate's levers were undone
                what = (f"the baseline side ({','.join(base) or 'no levers'}, after the "
                        "candidate's levers were undone)")
            elif run.failed_side == CANDIDATE:
                what = "the stack"
            else:
                what = "the A/B's run of the script"
            return failed(base, stack, f"{what} failed in the script: {run.error}", wall_s)
        parity = script_parity(
            reference, run.parity_losses, repeat, tolerance_of(stack),
            num_steps=design.trial.parity_steps, first_step=design.script_warmup + 1,
        )
        return trial_from_run(base, stack, run, parity, design, wall_s)

    return measure


def _nonfinite(base: Stack, stack: Stack, run: TrialRun, wall_s: float) -> Trial:
    """The A/B's run stopped on a NaN/inf loss (ab's kill line): killed, nothing judged."""
    bad = run.data["nonfinite"]
    if bad.get("side") == BASELINE:
        whose = (f"the baseline side's ({','.join(base) or 'no levers'}, after the candidate's "
                 "levers were undone)")
    else:
        whose = f"the stack's ({','.join(stack)})"
    return Trial(
        base=base, stack=stack, decision=KILLED,
        killed=(f"{whose} loss is {bad['loss']} at optimizer step {bad['step']} of the script "
                "(the loss the probe saw there without levers was finite); the run was stopped"),
        killed_kind="nonfinite_loss", wall_s=wall_s,
    )


def _out_of_time(base: Stack, stack: Stack, wall_s: float) -> Trial:
    return Trial(
        base=base, stack=stack, decision=KILLED,
        killed="the time budget ran out while the A/B's run of the script ran",
        killed_kind="time_budget", wall_s=wall_s,
    )


# --- the whole search --------------------------------------------------------------------------


def _ignore(_: object) -> None:
    pass


def _low_precision(probe: TrialRun) -> tuple[bool, str | None]:
    low = ("bfloat16", "float16")
    autocast = probe.data.get("autocast")
    return probe.data.get("param_dtype") in low or autocast in low, autocast


def tune_script(
    command: Sequence[str],
    options: TuneOptions = TuneOptions(),
    *,
    run_script: RunScript | None = None,
    measure: Measure | None = None,
    say: Callable[[str], None] = _ignore,
    clock: Callable[[], float] = time.monotonic,
) -> TuneResult:
    """Search the fastest proven stack for the script ``command`` (``["python", "train.py",
    ...]`` as typed after ``--``) with ``options`` (checked where they were given:
    :meth:`levers.tune.options.TuneOptions.checked`). ``run_script`` replaces the runs of the
    script and ``measure`` the A/Bs (tests' fakes).

    Raises:
        ValueError: a design that cannot run (``--rounds`` below 1).
        LeversError: the script ends before its steps are timed; StepError: it fails there.
    """
    display = shlex.join(command)
    registry = load_all()
    design = ScriptDesign(
        options.design, rounds=DEFAULT_ROUNDS if options.rounds is None else options.rounds
    )
    budget_s, only, exclude = options.budget_s, options.only, options.exclude
    use_audit, record_path = options.use_audit, options.record_path
    start = clock()

    def left_s() -> float:
        return budget_s - (clock() - start)

    with tempfile.TemporaryDirectory(prefix="levers-tune-") as workdir:
        runner = run_script or subprocess_runner(command, design, Path(workdir))
        say(f"tune: running {display} to find its model and the levers that apply in it")
        probe = checked_baseline(
            runner((), (), max(left_s(), 1.0), probe=True, audit=use_audit), display, design,
            design.steps_per_run,
        )
        say(f"tune: running {display} again without levers, to see whether its steps repeat")
        again = checked_baseline(
            runner((), (), max(left_s(), 1.0), rounds=0), display, design, design.repeat_steps
        )
        repeat = repeat_differences(probe.parity_losses, again.parity_losses)
        low_precision, autocast = _low_precision(probe)
        device = str(probe.data.get("device", "cpu"))
        applies = dict(probe.data.get("applies") or {})
        slower = dict(probe.data.get("slower") or {})
        notes = _probe_notes(probe, use_audit)
        ordered, skipped = candidates(
            registry,
            lambda lever: applies.get(lever.id, "levers did not check it on this script"),
            catalogue_rows=catalogue_rows(),
            on_gpu=device.startswith("cuda"),
            only=only,
            exclude=exclude,
            from_audit={k: (float(v[0]), str(v[1])) for k, v in
                        (probe.data.get("expected") or {}).items()},
            factory=False,
            slower_of=lambda lever: slower.get(lever.id),
            forms={k: tuple(v) for k, v in (probe.data.get("forms") or {}).items()},
        )
        note = gpu_only_note(skipped, device)
        if note:
            notes.append(note)

        def tolerance_of(levers: Stack) -> Tolerance:
            return stack_tolerance(levers, registry, low_precision, autocast)

        loosest = tolerance_of(tuple(c.lever for c in ordered)) if ordered else None
        not_tried = _unrepeatable(repeat, loosest, design) if loosest is not None else None

        if not_tried is not None:
            found = _nothing_tried(ordered, skipped, budget_s, clock() - start)
        else:
            found = search(
                ordered,
                measure or script_measure(
                    runner, design, reference=probe.parity_losses, tolerance_of=tolerance_of,
                    repeat=repeat, draws_random=probe.data.get("forward_draws_random"),
                    clock=clock,
                ),
                budget_s=max(left_s(), 0.0),
                skipped=skipped,
                clock=clock,
                say=say,
                on_trial=record_trials(
                    record_path, {"workload": display, "script": list(command)}
                ),
            )
            found = replace(found, budget_s=budget_s, spent_s=clock() - start)
    result = TuneResult(
        workload=f"-- {display}",
        params={},
        set_items=(),
        design=design.trial,
        device=device,
        search=found,
        notes=tuple(notes),
        script=tuple(command),
        rounds=design.rounds,
        not_tried=not_tried,
        names=probe.data.get("names"),
    )
    if record_path is not None:
        record_result(record_path, result)
    return result


def _probe_notes(probe: TrialRun, use_audit: bool) -> list[str]:
    data = probe.data
    notes = [
        f"the levers were applied inside the script to {data.get('model', 'its model')} "
        f"(found from {data.get('optimizer', 'the optimizer')}'s parameters) after its optimizer "
        f"step {data.get('warmup')}; each A/B is one run of the script, its sides in alternating "
        "windows of steps"
    ]
    if data.get("forward_draws_random"):
        notes.append(
            "the model's forward draws random numbers (dropout): a compiled candidate's parity "
            "steps draw them as eager does, and it is compiled again before its timed steps"
        )
    if use_audit and data.get("audit_error"):
        notes.append(
            f"the audit of the script's step could not run ({data['audit_error']}); the "
            "candidates are the catalogue's alone"
        )
    return notes


def _unrepeatable(
    repeat: Sequence[float | None], loosest: Tolerance, design: ScriptDesign
) -> str | None:
    """Why no A/B can check parity on this script (its runs differ beyond the loosest
    tolerance at a compared step), or None."""
    first = design.script_warmup + 1
    for i, diff in enumerate(list(repeat)[: design.trial.parity_steps]):
        if diff is not None and diff > _rtol(loosest, i):
            return (
                f"parity cannot be checked on this script: two runs of it without levers differ "
                f"by {diff:.3g} in the loss of step {first + i} (the loosest tolerance is "
                f"{_rtol(loosest, i):g}), so its steps are not repeatable and no lever could be "
                "proven; seed it (torch.manual_seed, the data order, the DataLoader's generator) "
                "and run levers tune again"
            )
    return None


def _nothing_tried(
    ordered: Sequence[Any], skipped: Sequence[Skipped], budget_s: float, spent_s: float
) -> SearchResult:
    """The search's answer when no A/B can run (``TuneResult.not_tried`` says why)."""
    outcomes = [Outcome(c.lever, False, "not tried: parity cannot be checked on this script",
                        source=c.source) for c in ordered]
    outcomes += [Outcome(s.lever, False, s.reason) for s in skipped]
    return SearchResult(
        stack=(), proof=None, outcomes=tuple(outcomes), trials=(), budget_s=budget_s,
        spent_s=spent_s, out_of_budget=False,
    )
