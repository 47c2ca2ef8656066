"""One side of a ``levers tune -- python train.py`` A/B: the script run once, in this process,
with levers applied inside it.

    python -m levers.cli.script_trial --out side.json [--levers A,B] [--warmup W]
        [--compile-steps C] [--steps T] [--probe] [--audit] -- python train.py [its arguments]

A private entry point: ``levers tune`` (:mod:`levers.tune.script`) starts one fresh process per
side and reads the JSON it writes. The script runs as ``levers audit -- python train.py`` runs it
(:func:`levers.integrations.script.run_script`): step boundaries come from ``optimizer.step()``,
the model from the optimizer's parameters. In order:

1. the script's first ``W`` optimizer steps run as they are (its own warm-up);
2. at the end of step ``W`` the levers are applied to the model found from the optimizer, as
   ``levers.apply(model, "A,B", optimizer=opt)`` would in the script (no ``step=``: the script
   runs its own step);
3. ``C`` more steps run untimed (compile warm-up);
4. ``T`` steps are timed, each from the end of one optimizer step to the end of the next (with a
   ``torch.cuda.synchronize()`` at each boundary on a GPU); the peak memory is the allocator's
   over them;
5. the script is stopped (as the audit stops it) and the JSON written, atomically.

The loss of each step from ``W + 1`` on is what the step passed to ``Tensor.backward`` (scalars
only; summed where gradient accumulation calls backward more than once a step), kept on the
device while the steps run and read as floats after them.

``--probe`` (the run levers tune makes first, without levers) also writes which levers apply to
the model found (each lever's ``applies``; a lever that wraps the training step cannot be applied
to a step the script runs itself) and the precision its step computes in; ``--audit`` then lets
one more step run under capture, audits it and writes the expected saving of each lever the
findings name (:func:`levers.tune.candidates.audit_expectations`).

The JSON always says how the run ended: ``complete`` (every step recorded), else ``error`` (the
script's exception, or a lever that could not be applied) and ``num_steps`` (how far it got).
"""

from __future__ import annotations

import functools
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

SCHEMA_VERSION = 1
# levers that replay CUDA graphs: their step wrapper marks where a step begins; in a script the
# boundary between two optimizer steps is that mark
CUDA_GRAPH_LEVERS = ("compile-model",)
WRAPS_STEP = (
    "it wraps the training step (the function that runs forward, backward and the optimizer), "
    "which a script runs itself; apply it in the script with levers.apply(model, ..., "
    "step=train_step) and call handle.step(), or tune a factory"
)


class LossTap:
    """Keeps each scalar passed to ``Tensor.backward`` while ``recording``; ``take()`` returns
    those of the step that just ended. ``Tensor.backward`` is put back on exit."""

    def __init__(self) -> None:
        self.recording = False
        self._seen: list[torch.Tensor] = []
        self._original: Callable[..., Any] | None = None

    def __enter__(self) -> LossTap:
        original = self._original = torch.Tensor.backward
        tap = self

        @functools.wraps(original)
        def backward(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if tap.recording and tensor.numel() == 1:
                # a copy: a CUDA graph's output (the loss) is overwritten by its next replay
                tap._seen.append(tensor.detach().clone())
            return original(tensor, *args, **kwargs)

        torch.Tensor.backward = backward  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: Any) -> None:
        torch.Tensor.backward = self._original  # type: ignore[method-assign]

    def take(self) -> list[torch.Tensor]:
        seen, self._seen = self._seen, []
        return seen


def _script_step() -> None:
    raise RuntimeError("the step of a running script is run by the script itself")


def applies_in_script(lever: Any, model: torch.nn.Module, optimizer: Any) -> str | None:
    """Why ``lever`` cannot be applied to this model inside the script, or None."""
    from levers.levers.lever import Target

    try:
        reason = lever.applies(Target(model=model, optimizer=optimizer))
        if reason is not None and lever.applies(
            Target(model=model, optimizer=optimizer, step=_script_step)
        ) is None:
            return WRAPS_STEP
    except Exception as exc:  # noqa: BLE001 - a lever whose check fails on this model is left out
        return f"its applies check raised {type(exc).__name__}: {exc}"
    return reason


class SideRecorder:
    """The optimizer-step callback of one side: applies the levers after the warm-up, times the
    steps after the compile warm-up, and keeps each step's loss."""

    def __init__(
        self, *, stack: Sequence[str], warmup: int, compile_steps: int, timed: int,
        probe: bool, stop_at_end: bool, tap: LossTap,
    ) -> None:
        self.stack = list(stack)
        self.warmup = warmup
        self.compile_steps = compile_steps
        self.timed = timed
        self.probe = probe
        self.stop_at_end = stop_at_end
        self.tap = tap
        self.data: dict[str, Any] = {"stack": self.stack, "applied": [], "complete": False}
        self.step_s: list[float] = []
        self.losses: list[list[torch.Tensor]] = []
        self.handle: Any = None  # the applied levers: kept on until the process ends
        self._t_last = 0.0
        self._device: torch.device | None = None
        self._precision_hooks: list[Any] = []
        self._autocast_seen: list[str] = []
        self._mark_graph_steps = False

    @property
    def last_step(self) -> int:
        return self.warmup + self.compile_steps + self.timed

    def on_step(self, num_steps: int, optimizer: torch.optim.Optimizer) -> None:
        from levers.integrations.steps import StopTraining

        if num_steps < self.warmup:
            return
        if num_steps == self.warmup:
            if not self._begin(optimizer):
                raise StopTraining
            self.tap.recording = True
            if self.compile_steps == 0:
                self._open_memory_window()
            self._t_last = self._now()
            return
        if num_steps > self.last_step:
            return
        self.losses.append(self.tap.take())
        now = self._now()
        if num_steps > self.warmup + self.compile_steps:
            self.step_s.append(now - self._t_last)
        self._t_last = now
        if num_steps == self.warmup + 1:
            self._end_precision_probe()
        if num_steps == self.warmup + self.compile_steps:
            self._open_memory_window()
        if self._mark_graph_steps:
            torch.compiler.cudagraph_mark_step_begin()
        if num_steps == self.last_step:
            self.tap.recording = False
            self._finish()
            if self.stop_at_end:
                raise StopTraining

    def _now(self) -> float:
        if self._device is not None and self._device.type == "cuda":
            torch.cuda.synchronize(self._device)  # sync point: a timing boundary between steps
        return time.perf_counter()

    def _begin(self, optimizer: torch.optim.Optimizer) -> bool:
        """Find the model, apply the levers (and probe); False when a lever could not be applied."""
        from levers.integrations.steps import find_model
        from levers.levers.handle import apply

        model = find_model(optimizer)
        params = [p for p in model.parameters() if p.is_floating_point()]
        self._device = params[0].device if params else torch.device("cpu")
        self.data.update(
            model=type(model).__name__,
            optimizer=type(optimizer).__name__,
            device=str(self._device),
            param_dtype=str(params[0].dtype).removeprefix("torch.") if params else None,
        )
        if self._device.type == "cuda":
            self.data["device_name"] = torch.cuda.get_device_name(self._device)
        if self.probe:
            from levers.levers import load_all

            self.data["applies"] = {
                lever_id: applies_in_script(lever, model, optimizer)
                for lever_id, lever in sorted(load_all().items())
            }
            self._start_precision_probe(model)
        if not self.stack:
            return True
        try:
            self.handle = apply(model, self.stack, optimizer=optimizer)
        except Exception as exc:  # noqa: BLE001 - the trial's answer: this stack cannot be applied
            self.data["error"] = _one_line(exc)
            return False
        self.data["applied"] = list(self.handle.applied)
        self._mark_graph_steps = self._device.type == "cuda" and any(
            spec.split(":", 1)[0] in CUDA_GRAPH_LEVERS for spec in self.stack
        )
        return True

    def _start_precision_probe(self, model: torch.nn.Module) -> None:
        from levers.ab.precision import autocast_dtype

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

    def _open_memory_window(self) -> None:
        if self._device is not None and self._device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self._device)

    def _finish(self) -> None:
        on_cuda = self._device is not None and self._device.type == "cuda"
        self.data.update(
            complete=True,
            step_s=list(self.step_s),
            # sync point: the losses are read after the timed steps
            losses=[_loss_of(step) for step in self.losses],
            peak_allocated_bytes=torch.cuda.max_memory_allocated(self._device) if on_cuda else None,
            peak_reserved_bytes=torch.cuda.max_memory_reserved(self._device) if on_cuda else None,
        )


def _loss_of(seen: list[torch.Tensor]) -> float | None:
    if not seen:
        return None
    return float(sum(float(t.float()) for t in seen))


def _one_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


@dataclass(frozen=True)
class SideArgs:
    """What one run of a side is asked to do (the child's command line, read by
    :mod:`levers.cli.script_trial`)."""

    out: str
    levers: str = ""
    warmup: int = 2
    compile_steps: int = 3
    steps: int = 10
    probe: bool = False
    audit: bool = False


def run_side(args: SideArgs, words: list[str]) -> dict[str, Any]:
    """Run the script once as the side ``args`` asks; the JSON document it writes."""
    from levers.integrations.script import parse_command, run_script

    stack = [s.strip() for s in args.levers.split(",") if s.strip()]
    command = parse_command(words)
    audit = args.probe and args.audit
    with LossTap() as tap:
        recorder = SideRecorder(
            stack=stack, warmup=args.warmup, compile_steps=args.compile_steps, timed=args.steps,
            probe=args.probe, stop_at_end=not audit, tap=tap,
        )
        # with --audit the watcher captures the step after the last recorded one
        run = run_script(command, warmup=recorder.last_step, on_step=recorder.on_step)
    data = {
        "schema": SCHEMA_VERSION,
        "command": command.display,
        "warmup": args.warmup,
        "compile_steps": args.compile_steps,
        "timed_steps": args.steps,
        **recorder.data,
        "num_steps": run.num_steps,
        "exit_code": run.exit_code,
        "script_error": run.error,
    }
    if not data["complete"] and "error" not in data:
        data["error"] = run.error or (
            f"the script ended after {run.num_steps} optimizer step(s) (exit code "
            f"{run.exit_code}); each run needs {recorder.last_step}"
        )
    if audit and run.capture is not None:
        data.update(_audit_expectations(run.capture))
    return data


def _audit_expectations(capture: Any) -> dict[str, Any]:
    from levers.integrations.inline import audit_capture
    from levers.tune.candidates import audit_expectations

    try:
        audited = audit_capture(capture)
    except Exception as exc:  # noqa: BLE001 - the catalogue still orders the candidates
        return {"audit_error": f"{type(exc).__name__}: {_one_line(exc)}"}
    expected = audit_expectations(audited.findings, audited.result.step_ms)
    return {
        "audit_step_ms": audited.result.step_ms,
        "expected": {lever: list(pair) for lever, pair in expected.items()},
    }


def run_and_write(args: SideArgs, words: list[str]) -> int:
    """Run the side and write its JSON to ``args.out`` (atomically); an error is said there."""
    from levers.output.atomic import atomic_write_text

    try:
        data = run_side(args, words)
    except Exception as exc:  # noqa: BLE001 - said in the JSON: the parent reads nothing else
        data = {"schema": SCHEMA_VERSION, "complete": False,
                "error": f"{type(exc).__name__}: {_one_line(exc)}", "num_steps": 0}
    atomic_write_text(args.out, json.dumps(data, indent=1) + "\n", make_parents=True)
    return 0
