"""One A/B of ``levers tune -- python train.py``: the script run once, in this process, its two
sides taking turns in windows of its own steps.

    python -m levers.cli.script_trial --out ab.json [--candidate A,B] [--baseline A]
        [--warmup W] [--parity-steps P] [--compile-steps C] [--steps K] [--rounds R]
        [--draws-random yes|no] [--probe] [--audit] -- python train.py [its arguments]

A private entry point: ``levers tune`` (:mod:`levers.tune.script`) starts one process per A/B
(and two without levers before its search) and reads the JSON it writes. The script runs as
``levers audit -- python train.py`` runs it (:func:`levers.integrations.script.run_script`):
step boundaries come from ``optimizer.step()``, the model from the optimizer's parameters. In
order:

1. the script's first ``W`` optimizer steps run as they are (its own warm-up);
2. at the end of step ``W`` the candidate's levers are applied to the model found from the
   optimizer, as ``levers.apply(model, "A,B", optimizer=opt)`` would in the script (no
   ``step=``: the script runs its own step), and its *window* begins: ``P`` parity steps (their
   losses kept), ``C`` untimed steps (compile warm-up), ``K`` timed steps;
3. at the end of the window the levers are undone (levers are reversible by contract) and the
   baseline's applied (none, or the stack an increment is added to), for its window of ``C``
   untimed and ``K`` timed steps; ``R`` pairs of windows in all, each pair in the other order
   from the one before (C B B C for two, C B B C C B for three: :func:`window_plan`), a window
   that follows its own side's running straight on, without untimed steps;
4. the script is stopped (as the audit stops it) and the JSON written, atomically.

A timed step runs from the end of one optimizer step to the end of the next (with a
``torch.cuda.synchronize()`` at each boundary on a GPU); applying and undoing happen between
two steps, outside them. The peak memory of a window is the allocator's over its timed steps.
The windows after the first change the training the script would have done (each side trains
the model further, and an undo may put an optimizer's state back as it was when the lever was
applied); only their times are read.

**Parity steps.** The losses of the candidate's first ``P`` steps (script steps ``W+1 ..
W+P``), what each step passed to ``Tensor.backward`` (scalars only; summed where gradient
accumulation calls backward more than once a step; a copy, read as a float at the step's end
after its time was taken), are what levers tune compares with those of the same steps of the
runs without levers.
While they run, inductor draws random numbers with eager's ops
(:func:`levers.ab.random_alike.drawn_alike`): a compiled dropout then takes the masks the eager
step takes. What was compiled so is dropped after them where the model's forward draws random
numbers (``--draws-random``, as the run without levers saw it with
:mod:`levers.integrations.random_draws`; not said: assumed so), and the candidate's warm-up
compiles it again with the user's setting: the timed steps run the program the user would run.

**NaN/inf.** Every step's loss from ``W+1`` on is read so, whichever side's window it is in: a
loss that is NaN or infinite stops the run there (ab's kill line), with ``nonfinite`` (its step,
loss, side and stack) in the JSON; no step of such a run is judged.

**Recompile limit.** A window with levers on whose steps made dynamo hit its recompile limit
ends the run with an error (a region past the limit runs uncompiled, and its steps would time
eager code under the candidate's name). Each window also says how many frames dynamo compiled
while it ran: a compile lever applied again after its undo reuses its programs (0).

With no ``--candidate`` and no ``--baseline`` it is a run without levers: ``--rounds 0`` runs
the parity steps alone (the repeat check), ``--probe`` (the first run levers tune makes) also
writes which levers apply to the model found (each lever's ``applies``; a lever that wraps the
training step cannot be applied to a step the script runs itself), which say they lose for speed
there (``slower_here``), the other forms to try (compile-model's default mode beside its CUDA
graphs on a GPU), the precision its step computes in and whether its forward draws random
numbers; ``--audit`` then lets one more step run under capture, audits it and writes the
expected saving of each lever the findings name
(:func:`levers.tune.candidates.audit_expectations`).

The JSON always says how the run ended: ``complete`` (every window ran), else ``error`` (the
script's exception, a lever that could not be applied or undone, the recompile limit, a
NaN/inf loss),
``failed_side`` (the side whose window was on) and ``num_steps`` (how far it got).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from levers.ab.precision import autocast_dtype
from levers.ab.random_alike import drawn_alike, recompile_for_timing
from levers.capture import compile_stats
from levers.capture.loss import LossTap, loss_of, nonfinite
from levers.integrations.inline import audit_capture
from levers.integrations.random_draws import ForwardDraws
from levers.integrations.script import parse_command, run_script
from levers.integrations.script_names import find_names
from levers.integrations.steps import StopTraining, find_model
from levers.levers import load_all
from levers.levers._compile_setup import recompile_limit
from levers.levers.handle import apply
from levers.levers.lever import Target, lever_id_of
from levers.output.atomic import atomic_write_text
from levers.tune.candidates import audit_expectations
from levers.tune.run import lever_forms

SCHEMA_VERSION = 2
CANDIDATE = "candidate"
BASELINE = "baseline"
# levers that may replay CUDA graphs (compile-model's own choice on a static step, either compile
# lever in a CUDA-graph mode): their step wrapper marks where a step begins; in a script the
# boundary between two optimizer steps is that mark (where no graphs replay, a mark does nothing)
CUDA_GRAPH_LEVERS = ("compile-model", "compile-blocks")
WRAPS_STEP = (
    "it wraps the training step (the function that runs forward, backward and the optimizer), "
    "which a script runs itself; apply it in the script with levers.apply(model, ..., "
    "step=train_step) and call handle.step(), or tune a factory"
)
DRAWS_RANDOM = {"yes": True, "no": False}


def _script_step() -> None:
    raise RuntimeError("the step of a running script is run by the script itself")


def applies_in_script(lever: Any, model: torch.nn.Module, optimizer: Any) -> str | None:
    """Why ``lever`` cannot be applied to this model inside the script, or None."""
    try:
        reason = lever.applies(Target(model=model, optimizer=optimizer))
        if reason is not None and lever.applies(
            Target(model=model, optimizer=optimizer, step=_script_step)
        ) is None:
            return WRAPS_STEP
    except Exception as exc:  # noqa: BLE001 - a lever whose check fails on this model is left out
        return f"its applies check raised {type(exc).__name__}: {exc}"
    return reason


def _slower_in_script(lever: Any, model: torch.nn.Module, optimizer: Any) -> str | None:
    try:
        return lever.slower_here(Target(model=model, optimizer=optimizer))
    except Exception:  # noqa: BLE001 - a check that fails says nothing: the A/B will tell
        return None


@dataclass(frozen=True)
class Window:
    """One stretch of the script's steps with one side's levers on: ``parity`` steps whose
    losses are kept, then ``untimed`` steps, then ``timed`` steps."""

    side: str
    stack: tuple[str, ...]
    parity: int = 0
    untimed: int = 0
    timed: int = 0

    @property
    def num_steps(self) -> int:
        return self.parity + self.untimed + self.timed


def window_plan(
    candidate: Sequence[str], baseline: Sequence[str], *, parity: int, untimed: int, timed: int,
    rounds: int,
) -> list[Window]:
    """The windows of one A/B: ``rounds`` pairs, the candidate's first (its first ``parity``
    steps are the parity steps) and then in the order C B B C C B ...: each pair in the other
    order from the one before, so that a drift of the step time over the run (a warming host,
    a growing cache) falls on both sides alike instead of on whichever side comes second, and
    the levers are switched at every other window boundary only. A window after a switch starts
    with ``untimed`` steps (compile warm-up, settling), one that follows its own side's window
    runs straight on. With 0 rounds, the parity steps alone."""
    if rounds == 0:
        return [Window(CANDIDATE, tuple(candidate), parity=parity)]
    sides = {CANDIDATE: tuple(candidate), BASELINE: tuple(baseline)}
    plan: list[Window] = []
    for r in range(rounds):
        for side in (CANDIDATE, BASELINE) if r % 2 == 0 else (BASELINE, CANDIDATE):
            switched = not plan or plan[-1].side != side
            plan.append(Window(side, sides[side], parity if not plan else 0,
                               untimed if switched else 0, timed))
    return plan


def _lever_ids(stack: Sequence[str]) -> set[str]:
    return {lever_id_of(spec) for spec in stack}


def _dynamo_counts() -> tuple[int, int]:
    """(frames dynamo compiled, times it hit its recompile limit) in this process so far."""
    seen = compile_stats.snapshot()
    return seen.frames_ok, seen.limit_messages


class WindowRecorder:
    """The optimizer-step callback of one A/B: switches the levers at window boundaries, keeps
    the parity steps' losses and times the timed steps of each window."""

    def __init__(
        self, *, plan: Sequence[Window], warmup: int, probe: bool, stop_at_end: bool,
        tap: LossTap, draws_random: bool | None = None,
    ) -> None:
        if not plan or plan[0].parity < 1:
            raise ValueError("the first window of a plan holds the parity steps (at least one)")
        self.plan = list(plan)
        self.warmup = warmup
        self.probe = probe
        self.stop_at_end = stop_at_end
        self.tap = tap
        self.draws_random = draws_random
        self.data: dict[str, Any] = {"complete": False}
        self.windows: list[dict[str, Any]] = []  # what each window that began did
        self.parity_losses: list[float | None] = []
        self._model: torch.nn.Module | None = None
        self._optimizer: torch.optim.Optimizer | None = None
        self._handle: Any = None  # the levers on now
        self._stack: tuple[str, ...] = ()
        self._index = -1  # the window on now
        self._done_in_window = 0
        self._t_last = 0.0
        self._device: torch.device | None = None
        self._counts_at_start = (0, 0)
        self._mark_graph_steps = False
        self._drawn_alike: Any = None  # the context manager, while the parity steps run
        self._compiled: Any = None
        self._forward_draws: Any = None
        self._precision_hooks: list[Any] = []
        self._autocast_seen: list[str] = []
        # where the run's time goes: the script's start to the first levers, parity, windows
        self.phase_s: dict[str, float] = {}
        self._t_phase = time.perf_counter()

    @property
    def last_step(self) -> int:
        return self.warmup + sum(w.num_steps for w in self.plan)

    @property
    def window(self) -> Window:
        return self.plan[self._index]

    def on_step(self, num_steps: int, optimizer: torch.optim.Optimizer) -> None:
        if num_steps < self.warmup or num_steps > self.last_step:
            return
        if num_steps == self.warmup:
            self._phase("script_start")
            self._begin(optimizer)
            if not self._enter(0):
                raise StopTraining
            if self._mark_graph_steps:
                torch.compiler.cudagraph_mark_step_begin()
            self._t_last = self._now()
            return
        seen = self.tap.take()
        now = self._now()
        window = self.window
        self._done_in_window += 1
        done = self._done_in_window
        if done > window.parity + window.untimed:
            self.windows[-1]["step_s"].append(now - self._t_last)
        loss = loss_of(seen)  # sync point: after the step's time was read
        if done <= window.parity:
            self.parity_losses.append(loss)
        if nonfinite(loss):
            self._stop_nonfinite(num_steps, loss)
            raise StopTraining
        if num_steps == self.warmup + 1:
            self._end_precision_probe()
        if window.parity and done == window.parity:
            self._end_parity()
        if done == window.parity + window.untimed and window.timed:
            self._open_memory_window()
        if done == window.num_steps:
            if not self._close():
                raise StopTraining
            if self._index + 1 == len(self.plan):
                self._finish()
                if self.stop_at_end:
                    raise StopTraining
                return
            if not self._enter(self._index + 1):
                raise StopTraining
        if self._mark_graph_steps:
            torch.compiler.cudagraph_mark_step_begin()
        self._t_last = self._now()

    def _stop_nonfinite(self, num_steps: int, loss: float | None) -> None:
        """A step's loss is NaN or infinite: no step of this run can be judged (ab's kill line)."""
        window = self.window
        levers = ",".join(window.stack) or "no levers"
        self.data["nonfinite"] = {
            "step": num_steps, "loss": repr(loss), "side": window.side, "stack": list(window.stack),
        }
        self._fail(
            f"the loss passed to backward() is {loss} at optimizer step {num_steps} of the "
            f"script, in the {window.side}'s window ({levers} on); the run was stopped there"
        )

    def where(self) -> dict[str, Any]:
        """The window on now (the side whose levers were on when a run ended early)."""
        if self._index < 0:
            return {}
        return {"failed_side": self.window.side, "failed_window": self._index}

    def close(self) -> None:
        """Put back what a run that ended inside its parity steps left on (the random-number
        setting); the levers themselves end with the process."""
        if self._drawn_alike is not None:
            self._drawn_alike.__exit__(None, None, None)
            self._drawn_alike = None
        if self._forward_draws is not None:
            self._forward_draws.__exit__(None, None, None)
            self._forward_draws = None

    def _phase(self, name: str) -> None:
        now = time.perf_counter()
        self.phase_s[name] = now - self._t_phase
        self._t_phase = now

    def _now(self) -> float:
        if self._device is not None and self._device.type == "cuda":
            torch.cuda.synchronize(self._device)  # sync point: a timing boundary between steps
        return time.perf_counter()

    # --- the model, once ----------------------------------------------------------------------

    def _begin(self, optimizer: torch.optim.Optimizer) -> None:
        model = self._model = find_model(optimizer)
        self._optimizer = optimizer
        params = [p for p in model.parameters() if p.is_floating_point()]
        self._device = params[0].device if params else torch.device("cpu")
        self.data.update(
            model=type(model).__name__,
            optimizer=type(optimizer).__name__,
            # inside the script's optimizer.step(): its frames are on the stack
            names=find_names(model, optimizer).to_dict(),
            device=str(self._device),
            param_dtype=str(params[0].dtype).removeprefix("torch.") if params else None,
        )
        if self._device.type == "cuda":
            self.data["device_name"] = torch.cuda.get_device_name(self._device)
        if self.probe:
            self._probe_levers(model, optimizer)
            self._start_precision_probe(model)

    def _probe_levers(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        registry = sorted(load_all().items())
        self.data["applies"] = {
            lever_id: applies_in_script(lever, model, optimizer) for lever_id, lever in registry
        }
        self.data["slower"] = {
            lever_id: why for lever_id, lever in registry
            if lever.slower_here is not None
            and (why := _slower_in_script(lever, model, optimizer)) is not None
        }
        on_gpu = self._device is not None and self._device.type == "cuda"
        self.data["forms"] = {k: list(v) for k, v in lever_forms(model, on_gpu).items()}

    def _start_precision_probe(self, model: torch.nn.Module) -> None:
        device_type = self._device.type if self._device is not None else "cpu"

        def hook(module: torch.nn.Module, args: object) -> None:
            dtype = autocast_dtype(device_type)
            if dtype is not None and not self._autocast_seen:
                self._autocast_seen.append(str(dtype).removeprefix("torch."))

        # every module: a wrapper may enter autocast inside the model's own forward (accelerate)
        self._precision_hooks = [m.register_forward_pre_hook(hook) for m in model.modules()]

    def _end_precision_probe(self) -> None:
        if not self.probe:
            return
        for handle in self._precision_hooks:
            handle.remove()
        self._precision_hooks = []
        self.data["autocast"] = self._autocast_seen[0] if self._autocast_seen else None

    # --- windows ------------------------------------------------------------------------------

    def _fail(self, error: str) -> bool:
        self.data.update(error=error, **self.where())
        return False

    def _enter(self, index: int) -> bool:
        """Begin window ``index``: its side's levers on (the previous side's undone first);
        False when that could not be done (the error is in ``data``)."""
        self._index = index
        self._done_in_window = 0
        window = self.window
        self.windows.append(
            {"side": window.side, "stack": list(window.stack), "applied": [], "step_s": []}
        )
        if window.stack != self._stack:
            if self._handle is not None:
                undone = ",".join(self._handle.applied)
                try:
                    self._handle.undo()
                except Exception as exc:  # noqa: BLE001 - the A/B cannot go on: said in the JSON
                    return self._fail(f"undoing {undone} raised {type(exc).__name__}: "
                                      f"{_one_line(exc)}")
                self._handle = None
            self._stack = ()
            if window.stack:
                try:
                    self._handle = apply(self._model, list(window.stack), optimizer=self._optimizer)
                except Exception as exc:  # noqa: BLE001 - the trial's answer: it cannot be applied
                    return self._fail(_one_line(exc))
            self._stack = window.stack
        if self._handle is not None:
            self.windows[-1]["applied"] = list(self._handle.applied)
        on_cuda = self._device is not None and self._device.type == "cuda"
        self._mark_graph_steps = on_cuda and bool(_lever_ids(window.stack) & set(CUDA_GRAPH_LEVERS))
        self._counts_at_start = _dynamo_counts()
        if window.parity:
            self._start_parity()
        if window.parity + window.untimed == 0:
            self._open_memory_window()
        return True

    def _close(self) -> bool:
        """End the window on now: its peak, and the recompile-limit check."""
        on_cuda = self._device is not None and self._device.type == "cuda"
        record = self.windows[-1]
        record["peak_allocated_bytes"] = (
            torch.cuda.max_memory_allocated(self._device) if on_cuda and self.window.timed else None
        )
        record["peak_reserved_bytes"] = (
            torch.cuda.max_memory_reserved(self._device) if on_cuda and self.window.timed else None
        )
        frames, hits = (n - before for n, before in zip(_dynamo_counts(), self._counts_at_start))
        record["compiled_frames"] = frames  # 0 where a stack applied again reuses its programs
        record["recompile_limit_hits"] = hits
        if hits and self.window.stack:
            return self._fail(
                f"dynamo hit its recompile limit ({recompile_limit()}) {hits} time(s) while "
                f"{','.join(self.window.stack)} was on (the {self.window.side}'s window "
                f"{self._index // 2 + 1}): a compiled region past the limit runs uncompiled, so "
                "its steps would time eager code; the script's own compiled code may be the one "
                "that recompiles (TORCH_LOGS=recompiles shows which)"
            )
        return True

    def _start_parity(self) -> None:
        self.tap.recording = True  # every step's loss from here on, each checked for NaN/inf
        if self.probe and self._model is not None:
            self._forward_draws = ForwardDraws(self._model).__enter__()
        if self.window.stack:
            self._drawn_alike = drawn_alike()
            self._compiled = self._drawn_alike.__enter__()

    def _end_parity(self) -> None:
        self._phase("parity")
        if self._forward_draws is not None:
            self._forward_draws.__exit__(None, None, None)
            self.data["forward_draws_random"] = self._forward_draws.drew
            self._forward_draws = None
        if self._drawn_alike is None:
            return

        self._drawn_alike.__exit__(None, None, None)
        self._drawn_alike = None
        self.data["random"] = {
            "drawn_alike": True,
            "compiled_graphs": self._compiled.graphs,
            "draws_random": self.draws_random,
            "recompiled": recompile_for_timing(self._compiled, self.draws_random),
        }

    def _open_memory_window(self) -> None:
        if self._device is not None and self._device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self._device)

    def _finish(self) -> None:
        self.tap.recording = False  # the probe's audited step after this one is not the A/B's
        self._phase("windows")
        self.data.update(complete=True, phase_s=self.phase_s, parity_losses=self.parity_losses)


def _one_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _stack_of(ids: str) -> tuple[str, ...]:
    return tuple(s.strip() for s in ids.split(",") if s.strip())


@dataclass(frozen=True)
class TrialArgs:
    """What one run of the script is asked to do (the child's command line, read by
    :mod:`levers.cli.script_trial`)."""

    out: str
    candidate: str = ""
    baseline: str = ""
    warmup: int = 2
    parity_steps: int = 3
    compile_steps: int = 3
    steps: int = 10
    rounds: int = 2
    draws_random: str | None = None  # "yes", "no", or not said
    probe: bool = False
    audit: bool = False

    def plan(self) -> list[Window]:
        return window_plan(
            _stack_of(self.candidate), _stack_of(self.baseline), parity=self.parity_steps,
            untimed=self.compile_steps, timed=self.steps, rounds=self.rounds,
        )


def run_trial(args: TrialArgs, words: list[str]) -> dict[str, Any]:
    """Run the script once as ``args`` asks; the JSON document it writes."""
    command = parse_command(words)
    audit = args.probe and args.audit
    plan = args.plan()
    with LossTap() as tap:
        recorder = WindowRecorder(
            plan=plan, warmup=args.warmup, probe=args.probe, stop_at_end=not audit, tap=tap,
            draws_random=DRAWS_RANDOM.get(args.draws_random or ""),
        )
        try:
            # with --audit the watcher captures the step after the last recorded one
            run = run_script(command, warmup=recorder.last_step, on_step=recorder.on_step)
        finally:
            recorder.close()
    data = {
        "schema": SCHEMA_VERSION,
        "command": command.display,
        "warmup": args.warmup,
        "plan": [asdict(window) for window in plan],
        **recorder.data,
        "windows": recorder.windows,  # those that began, a run cut short's included
        "num_steps": run.num_steps,
        "exit_code": run.exit_code,
        "script_error": run.error,
    }
    if not data["complete"] and "error" not in data:
        data["error"] = run.error or (
            f"the script ended after {run.num_steps} optimizer step(s) (exit code "
            f"{run.exit_code}); each run needs {recorder.last_step}"
        )
        data.update(recorder.where())
    if audit and run.capture is not None:
        data.update(_audit_expectations(run.capture))
    return data


def _audit_expectations(capture: Any) -> dict[str, Any]:
    try:
        audited = audit_capture(capture)
    except Exception as exc:  # noqa: BLE001 - the catalogue still orders the candidates
        return {"audit_error": f"{type(exc).__name__}: {_one_line(exc)}"}
    expected = audit_expectations(audited.findings, audited.result.step_ms)
    return {
        "audit_step_ms": audited.result.step_ms,
        "expected": {lever: list(pair) for lever, pair in expected.items()},
    }


def run_and_write(args: TrialArgs, words: list[str]) -> int:
    """Run the A/B and write its JSON to ``args.out`` (atomically); an error is said there."""
    try:
        data = run_trial(args, words)
    except Exception as exc:  # noqa: BLE001 - said in the JSON: the parent reads nothing else
        data = {"schema": SCHEMA_VERSION, "complete": False,
                "error": f"{type(exc).__name__}: {_one_line(exc)}", "num_steps": 0}
    atomic_write_text(args.out, json.dumps(data, indent=1) + "\n", make_parents=True)
    return 0
