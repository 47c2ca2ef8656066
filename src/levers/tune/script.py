"""``levers tune -- python train.py``: the search of :mod:`levers.tune.search` on an unchanged
script.

A factory can build its workload again for each side of an A/B; a script builds its model as it
runs. So each side of each A/B here is one run of the script in a fresh process
(``python -m levers.cli.script_trial``), which applies the side's levers in-process after the
script's first optimizer steps, times the next ones and writes what it saw as JSON
(:mod:`levers.integrations.script_trial`). This module starts those runs and compares them:

- **Before the search**, one run without levers (the *probe*) finds the model from the
  optimizer, says which levers apply to it inside the script and the precision the step computes
  in, and (unless ``--no-audit``) audits one step for the levers' expected savings; a second run
  without levers checks that the script's steps repeat. A script that fails or ends before its
  steps are timed is refused here, before the search.
- **Each A/B** runs the two sides alternately, ``rounds`` times (A B A B for two), each run
  timing ``ceil(steps / rounds)`` steps after ``warmup`` untimed ones (compile warm-up), so that
  drift of the host is shared by both sides. Pair ``(r, j)`` is the j-th timed step of round
  ``r`` on each side; ab's paired bootstrap (:func:`levers.ab.stats.paired_ratio_ci`) gives the
  CI95 of the step-time ratio and of the tokens/s ratio (read as steps/s: both sides run the
  script's own batches, the same tokens per step, since no lever that changes the batch is
  tried) and tune's :func:`levers.tune.trial.judge` decides.
- **Parity**: the losses of the same script steps (the first ``parity_steps`` after the levers
  are applied) of each candidate run and the baseline run of its round are compared within the
  tolerance of the levers added: ab's fixed tolerance for their declared safety and the step's
  precision (:func:`levers.ab.parity.tolerance_for`), or the levers' declared tolerance where
  that is looser. This needs steps that repeat: when two runs of the baseline differ beyond the
  tolerance at a compared step (an unseeded script, nondeterministic data order), parity is "not
  checked: the script's steps are not repeatable", never PARITY, and so nothing is kept (judge
  keeps a lever only with parity held). When they differ beyond even the loosest tolerance, no
  A/B is run and the result says why.
- **Peak memory**: the CUDA allocator's peak over each run's timed steps; not measured on a CPU.
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

from levers.ab.parity import Tolerance, rel_diff, tolerance_for
from levers.ab.stats import paired_ratio_ci
from levers.ab.verdict import (
    DAMAGED,
    KILLED,
    NOT_MEASURED,
    PARITY,
    decision,
    ratio_verdict,
)
from levers.errors import LeversError, StepError
from levers.tune.candidates import Skipped, candidates, check_ids
from levers.tune.measure import TrialDesign
from levers.tune.result import TuneResult
from levers.tune.search import Outcome, SearchResult, search
from levers.tune.trial import Measure, Stack, Trial, failed
from levers.vocab import CHANGES_NUMERICS, EXACT

DEFAULT_ROUNDS = 2
# the script's own optimizer steps before the levers are applied (its data workers, allocator
# growth and lazily created optimizer state come first, as for the audit's capture)
SCRIPT_WARMUP = 2
TRIAL_MODULE = "levers.cli.script_trial"  # its command line; the run: integrations.script_trial
NOT_REPEATABLE = "not checked: the script's steps are not repeatable"
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
        if self.trial.parity_steps > self.trial.warmup + self.timed_per_run:
            raise ValueError(
                f"--parity-steps {self.trial.parity_steps} compares more steps than one run of the "
                f"script records after the levers are applied ({self.trial.warmup} warm-up + "
                f"{self.timed_per_run} timed); lower it or raise --steps"
            )

    @property
    def timed_per_run(self) -> int:
        return math.ceil(self.trial.steps / self.rounds)

    @property
    def steps_per_run(self) -> int:
        """The optimizer steps each run of the script must reach."""
        return self.script_warmup + self.trial.warmup + self.timed_per_run

    def layout(self) -> str:
        return (
            f"{self.script_warmup} before the levers are applied, --warmup {self.trial.warmup} "
            f"after, then {self.timed_per_run} timed (--steps {self.trial.steps} over --rounds "
            f"{self.rounds})"
        )


@dataclass(frozen=True)
class SideRun:
    """One run of the script, as its process wrote it (``data`` is the whole document)."""

    stack: Stack
    complete: bool
    step_s: tuple[float, ...] = ()
    losses: tuple[float | None, ...] = ()  # script steps W+1 .. W+C+T
    peak_allocated_bytes: int | None = None
    error: str | None = None
    timed_out: bool = False
    log_tail: str = ""
    data: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_document(cls, stack: Stack, data: Mapping[str, Any], log_tail: str = "") -> SideRun:
        return cls(
            stack=stack,
            complete=bool(data.get("complete")),
            step_s=tuple(data.get("step_s") or ()),
            losses=tuple(data.get("losses") or ()),
            peak_allocated_bytes=data.get("peak_allocated_bytes"),
            error=data.get("error"),
            log_tail=log_tail,
            data=dict(data),
        )


class RunSide(Protocol):
    def __call__(
        self, stack: Stack, timeout_s: float | None, *, probe: bool = False, audit: bool = False
    ) -> SideRun: ...


def _levers_path() -> str:
    """The directory this levers package is imported from, for the child's ``sys.path``."""
    import levers

    return str(Path(levers.__file__).resolve().parents[1])


def _tail(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-_LOG_TAIL_LINES:])


def subprocess_runner(command: Sequence[str], design: ScriptDesign, workdir: Path) -> RunSide:
    """A :class:`RunSide` that runs ``command`` (``python train.py ...``) in a fresh process
    per side; its output goes to a log in ``workdir`` (its last lines come back on failure)."""
    count = [0]

    def run(
        stack: Stack, timeout_s: float | None, *, probe: bool = False, audit: bool = False
    ) -> SideRun:
        count[0] += 1
        out = workdir / f"run-{count[0]}.json"
        log = workdir / f"run-{count[0]}.log"
        argv = [
            sys.executable, "-m", TRIAL_MODULE, "--out", str(out), "--levers", ",".join(stack),
            "--warmup", str(design.script_warmup), "--compile-steps", str(design.trial.warmup),
            "--steps", str(design.timed_per_run),
            *(["--probe"] if probe else []), *(["--audit"] if audit else []),
            "--", *command,
        ]
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
                return SideRun(stack, complete=False, timed_out=True, log_tail=_tail(log),
                               error=f"the run did not end within {timeout_s:.0f} s")
            except BaseException:
                _kill(proc)
                raise
        if not out.is_file():
            return SideRun(stack, complete=False, log_tail=_tail(log), error=(
                f"the run's process exited with {proc.returncode} before it wrote its result"
            ))
        return SideRun.from_document(stack, json.loads(out.read_text()), _tail(log))

    return run


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


# --- before the search: the probe and the repeat check --------------------------------------


def checked_baseline(run: SideRun, display: str, design: ScriptDesign) -> SideRun:
    """``run`` (a run without levers) when it recorded every step; else the error that says why
    levers tune cannot run this script."""
    if run.complete:
        return run
    data = run.data
    seen = data.get("num_steps", 0)
    needed = design.steps_per_run
    log = f"\nits last lines:\n{run.log_tail}" if run.log_tail else ""
    if run.timed_out:
        raise LeversError(
            f"{display} did not reach its optimizer step {needed} within the budget; raise "
            f"--budget or lower --steps and --warmup (each run needs {design.layout()}){log}"
        )
    if data.get("exit_code") == 0 and data.get("script_error") is None and seen < needed:
        raise LeversError(
            f"{display} ended after {seen} optimizer step(s); levers tune runs it to step "
            f"{needed} each time ({design.layout()}): let the script run more steps (its own "
            "steps argument) or lower --steps and --warmup"
        )
    raise StepError(
        f"{display} failed before levers tune could time its steps (after {seen} optimizer "
        f"step(s)): {run.error}; run it on its own to check that it trains{log}"
    )


def repeat_differences(first: SideRun, second: SideRun) -> list[float | None]:
    """Per recorded step, the relative difference of two runs' losses (None: no loss seen)."""
    return [
        None if a is None or b is None else rel_diff(a, b)
        for a, b in zip(first.losses, second.losses)
    ]


# --- one A/B ---------------------------------------------------------------------------------


def stack_tolerance(
    levers: Sequence[str], registry: Mapping[str, Any], low_precision: bool,
    autocast: str | None,
) -> Tolerance:
    """The tolerance the losses of ``levers`` are held to: ab's fixed tolerance for their
    declared safety and the step's precision, or their declared tolerance where looser."""
    chosen = [registry[lever.split(":", 1)[0]] for lever in levers]
    exact = all(lever.safety == EXACT for lever in chosen)
    tolerance = tolerance_for(EXACT if exact else CHANGES_NUMERICS, low_precision, autocast)
    declared = max((lever.tolerance or 0.0 for lever in chosen), default=0.0)
    return replace(
        tolerance,
        rtol_first=max(tolerance.rtol_first, declared),
        rtol_last=max(tolerance.rtol_last, declared),
    )


def _rtol(tolerance: Tolerance, index: int) -> float:
    return tolerance.rtol_first if index == 0 else tolerance.rtol_last


def script_parity(
    base_runs: Sequence[SideRun],
    cand_runs: Sequence[SideRun],
    repeat: Sequence[float | None],
    tolerance: Tolerance,
    *,
    num_steps: int,
    first_step: int,
) -> tuple[str, str]:
    """(verdict, note): the first ``num_steps`` recorded losses of each candidate run against
    the baseline run of its round. ``repeat`` is how far two runs of the baseline differ, per
    step (the runs before the search, and this A/B's own baseline runs are added to it);
    ``first_step`` is the script's step number of the first recorded loss."""
    repeat = list(repeat)[:num_steps] + [None] * max(num_steps - len(repeat), 0)
    for other in base_runs[1:]:
        own = repeat_differences(base_runs[0], other)
        repeat = [_worst(a, b) for a, b in zip(repeat, own)]
    for run in (*base_runs, *cand_runs):
        missing = [i for i in range(num_steps) if i >= len(run.losses) or run.losses[i] is None]
        if missing:
            return NOT_MEASURED, (
                f"not checked: levers saw no scalar loss passed to backward() in step "
                f"{first_step + missing[0]} of the script"
            )
    for i, diff in enumerate(repeat):
        if diff is not None and diff > _rtol(tolerance, i):
            return NOT_MEASURED, (
                f"{NOT_REPEATABLE} (two runs of the baseline differ by {diff:.3g} in the loss of "
                f"step {first_step + i}, tolerance {_rtol(tolerance, i):g}); seed the script "
                "(torch.manual_seed, the data order) so that its runs repeat"
            )
    largest = 0.0
    for base, cand in zip(base_runs, cand_runs):
        for i in range(num_steps):
            diff = rel_diff(base.losses[i], cand.losses[i])
            if diff > _rtol(tolerance, i):
                return DAMAGED, (
                    f"the loss of step {first_step + i} of the script differs by {diff:.3g} "
                    f"({cand.losses[i]:.6g} against {base.losses[i]:.6g}; tolerance "
                    f"{_rtol(tolerance, i):g}, {tolerance.exactness})"
                )
            largest = max(largest, diff)
    own = max((d for d in repeat if d is not None), default=0.0)
    last = first_step + num_steps - 1
    steps = f"step {first_step}" if num_steps == 1 else f"steps {first_step}-{last}"
    return PARITY, (
        f"the losses of {steps} of the script agree within {tolerance.rtol_last:g} "
        f"({tolerance.exactness}; largest difference {largest:.3g}, the baseline's own runs "
        f"{own:.3g})"
    )


def _worst(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    return a if b is None else max(a, b)


def trial_from_runs(
    base: Stack,
    stack: Stack,
    base_runs: Sequence[SideRun],
    cand_runs: Sequence[SideRun],
    parity: tuple[str, str],
    design: ScriptDesign,
    wall_s: float,
) -> Trial:
    """The :class:`Trial` the paired runs say: round ``r``'s j-th timed step of each side pair."""
    trial = design.trial
    base_s = [t for run in base_runs for t in run.step_s]
    cand_s = [t for run in cand_runs for t in run.step_s]
    pairs = min(len(base_s), len(cand_s))
    base_s, cand_s = base_s[:pairs], cand_s[:pairs]
    ci = dict(num_resamples=trial.resamples, seed=trial.seed)
    step_ci = paired_ratio_ci(base_s, cand_s, **ci)
    rate_ci = paired_ratio_ci([1 / t for t in base_s], [1 / t for t in cand_s], **ci)
    base_peaks = [r.peak_allocated_bytes for r in base_runs]
    cand_peaks = [r.peak_allocated_bytes for r in cand_runs]
    peaks = None
    peak_verdict = NOT_MEASURED
    if all(p for p in (*base_peaks, *cand_peaks)):
        peaks = (median(base_peaks), median(cand_peaks))
        if len(base_peaks) >= 2:
            peak_verdict = ratio_verdict(paired_ratio_ci(base_peaks, cand_peaks, **ci), "lower")
    verdicts = {
        "step_time": ratio_verdict(step_ci, "lower"),
        "tokens_per_s": ratio_verdict(rate_ci, "higher"),
        "peak_allocated": peak_verdict,
        "parity": parity[0],
    }
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
        warnings=(
            f"{len(base_runs)} run(s) of each side, alternating; {pairs} paired steps; tokens/s "
            "read as steps/s (the script's own batches on both sides)",
        ),
    )


def script_measure(
    run_side: RunSide,
    design: ScriptDesign,
    *,
    tolerance_of: Callable[[Stack], Tolerance],
    repeat: Sequence[float | None] = (),
    clock: Callable[[], float] = time.monotonic,
) -> Measure:
    """A :data:`levers.tune.trial.Measure` over runs of the script: ``rounds`` of (baseline,
    candidate), each a fresh run; ``tolerance_of(added levers)`` is the parity tolerance."""

    def measure(base: Stack, stack: Stack, time_budget_s: float | None) -> Trial:
        started = clock()
        base_runs: list[SideRun] = []
        cand_runs: list[SideRun] = []
        sides = ((base, base_runs, "baseline"), (stack, cand_runs, "candidate"))
        for _ in range(design.rounds):
            for side, runs, name in sides:
                left = None if time_budget_s is None else time_budget_s - (clock() - started)
                if left is not None and left <= 0:
                    return _out_of_time(base, stack, name, clock() - started)
                run = run_side(side, left)
                if run.timed_out:
                    return _out_of_time(base, stack, name, clock() - started)
                if not run.complete:
                    what = ("the stack" if name == "candidate" else
                            f"the baseline side ({','.join(side) or 'no levers'})")
                    return failed(base, stack, f"{what} failed in the script: {run.error}",
                                  clock() - started)
                runs.append(run)
        added = tuple(lever for lever in stack if lever not in base)
        first_step = design.script_warmup + 1
        parity = script_parity(
            base_runs, cand_runs, repeat if not base else (), tolerance_of(added),
            num_steps=design.trial.parity_steps, first_step=first_step,
        )
        return trial_from_runs(base, stack, base_runs, cand_runs, parity, design,
                               clock() - started)

    return measure


def _out_of_time(base: Stack, stack: Stack, side: str, wall_s: float) -> Trial:
    return Trial(
        base=base, stack=stack, decision=KILLED,
        killed=f"the time budget ran out while the {side} side ran",
        killed_kind="time_budget", wall_s=wall_s,
    )


# --- the whole search --------------------------------------------------------------------------


def _ignore(_: object) -> None:
    pass


def _low_precision(probe: SideRun) -> tuple[bool, str | None]:
    low = ("bfloat16", "float16")
    autocast = probe.data.get("autocast")
    return probe.data.get("param_dtype") in low or autocast in low, autocast


def tune_script(
    command: Sequence[str],
    *,
    budget_s: float,
    only: Sequence[str] | None = None,
    exclude: Sequence[str] = (),
    design: ScriptDesign = ScriptDesign(),
    use_audit: bool = True,
    record_path: str | os.PathLike | None = None,
    run_side: RunSide | None = None,
    measure: Measure | None = None,
    say: Callable[[str], None] = _ignore,
    clock: Callable[[], float] = time.monotonic,
) -> TuneResult:
    """Search the fastest proven stack for the script ``command`` (``["python", "train.py",
    ...]`` as typed after ``--``). ``run_side`` replaces the runs of the script and ``measure``
    the A/Bs (tests' fakes).

    Raises:
        ValueError: an unknown lever id, a design that cannot run.
        LeversError: the script ends before its steps are timed; StepError: it fails there.
    """
    from levers.levers import load_all
    from levers.tune.run import catalogue_rows, gpu_only_note, record_result, record_trials

    display = shlex.join(command)
    registry = load_all()
    check_ids(registry, [*(only or ()), *exclude])
    if record_path is not None:
        from levers.ab.record import check_record

        check_record(record_path)  # before any long work
    start = clock()

    def left_s() -> float:
        return budget_s - (clock() - start)

    with tempfile.TemporaryDirectory(prefix="levers-tune-") as workdir:
        runner = run_side or subprocess_runner(command, design, Path(workdir))
        say(f"tune: running {display} to find its model and the levers that apply in it")
        probe = checked_baseline(
            runner((), max(left_s(), 1.0), probe=True, audit=use_audit), display, design
        )
        say(f"tune: running {display} again without levers, to see whether its steps repeat")
        again = checked_baseline(runner((), max(left_s(), 1.0)), display, design)
        repeat = repeat_differences(probe, again)
        low_precision, autocast = _low_precision(probe)
        device = str(probe.data.get("device", "cpu"))
        applies = dict(probe.data.get("applies") or {})
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
                measure or script_measure(runner, design, tolerance_of=tolerance_of,
                                          repeat=repeat, clock=clock),
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
    )
    if record_path is not None:
        record_result(record_path, result)
    return result


def _probe_notes(probe: SideRun, use_audit: bool) -> list[str]:
    data = probe.data
    notes = [
        f"the levers were applied inside the script to {data.get('model', 'its model')} "
        f"(found from {data.get('optimizer', 'the optimizer')}'s parameters) after its optimizer "
        f"step {data.get('warmup')}; each side of each A/B is a fresh run of the script"
    ]
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
