"""Find the step boundaries of running training code from ``optimizer.step()``, and capture one
whole step between two of them.

A global optimizer step pre/post hook (``torch.optim.optimizer``'s) sees every optimizer, those
that Hugging Face's Trainer (through accelerate) and Lightning wrap included. A step boundary is
the end of a step of the *primary* optimizer (the first one seen), counted at the outermost
nesting level, so an optimizer that wraps another (accelerate's ``AcceleratedOptimizer``) is one
step, and a second optimizer (a GAN's) falls inside the captured step instead of cutting it.

The captured step runs from the post hook of one primary step to the post hook of the next:
zero_grad, data loading, forward, backward and the optimizer. In the two-pass mode (the
default, :mod:`levers.capture.timed`) the step after it, to the next post hook, is the timed
pass; a run that ends before that step has a one-pass capture of the recorded step. Lightning
calls the forward and backward from a closure inside ``optimizer.step(closure)``: the closure
is wrapped so that its ops are labelled forward and backward, not optimizer.

The model is the smallest ``nn.Module`` whose parameters cover the parameters of every optimizer
seen before the capture (found among the live objects), unless the caller names it. When more
than one optimizer steps, the capture says so (``workload_params["captured"]``): the captured
step is one whole iteration, from the primary optimizer's ``step()`` to its next, and it names
the other optimizers and how often each stepped inside it (a GAN's generator may step on other
iterations only).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)

from levers.capture import compile_stats
from levers.capture.loss import LossTap, loss_of
from levers.capture.records import Capture
from levers.capture.step import StepCapture, capture_mode
from levers.levers.applicability import with_applicability
from levers.capture.timed import TimedPass, join_passes
from levers.audit.script_step import SCRIPT_NAMES
from levers.errors import LeversError
from levers.integrations.script_names import ScriptNames, find_names
from levers.workload import Workload


class StopTraining(BaseException):
    """Raised out of an optimizer hook to end the user's run once its step is captured.

    A ``BaseException``, so that a training loop's ``except Exception`` does not swallow it.
    """


def _optimizer_names(optimizers: list[torch.optim.Optimizer]) -> dict[int, str]:
    """``SGD``, ``Adam``; ``Adam#1``, ``Adam#2`` where two share a class."""
    classes = [type(o).__name__ for o in optimizers]
    names = {}
    for i, optimizer in enumerate(optimizers):
        name = classes[i]
        if classes.count(name) > 1:
            name = f"{name}#{classes[:i + 1].count(name)}"
        names[id(optimizer)] = name
    return names


def _with_reason(capture: Capture, reason: str) -> Capture:
    assert capture.passes is not None
    return dataclasses.replace(
        capture, passes=dataclasses.replace(capture.passes, reason=reason)
    )


def _no_step() -> None:
    raise RuntimeError("the step of a running script is run by the script itself")


def _is_module(obj: Any) -> bool:
    # a weakref.proxy whose referent is gone (torch.compile keeps some) raises on isinstance
    try:
        return isinstance(obj, torch.nn.Module)
    except ReferenceError:
        return False


# classes that wrap a model and forward to it (their module paths only add a prefix): the model
# is the module inside them, whose paths read as the user wrote them
_WRAPPERS = frozenset({
    "DistributedDataParallel", "DataParallel", "FullyShardedDataParallel", "OptimizedModule",
    "LightningModule",
})


def _is_wrapper(module: torch.nn.Module) -> bool:
    return any(cls.__name__ in _WRAPPERS for cls in type(module).__mro__)


def find_model(
    *optimizers: torch.optim.Optimizer, called: frozenset[int] | set[int] = frozenset()
) -> torch.nn.Module:
    """The smallest live ``nn.Module`` whose parameters include all of the ``optimizers'``.

    Ties go first to the module that holds more of them counted where they are used, a tied
    weight counted at each of its places (a language model whose head shares the embedding's
    weight: ``OPTForCausalLM`` holds ``lm_head.weight`` beside its body's ``embed_tokens``, so it
    is the model, not its body, ``OPTDecoder``, whose parameters are the same set). Then, where
    ``called`` (the ids of the modules whose forward ran in a step) is known, to the outermost
    module that was called and is not a wrapper (DDP, a compiled module, a LightningModule): a
    model that computes its loss around a backbone holding every parameter (``Net.forward``
    calls ``self.body`` and takes the loss) is ``Net``, so its loss is inside the model. Then to
    the module with fewer submodules: the inner one, whose module paths read as the user wrote
    them.
    """
    wanted = {
        id(p) for optimizer in optimizers for group in optimizer.param_groups for p in group["params"]
    }
    best: tuple | None = None  # (-covered, num_params, -num_places, outermost called, size)
    best_module = None
    with warnings.catch_warnings():  # isinstance on some deprecated torch objects warns
        warnings.simplefilter("ignore")
        modules = [obj for obj in gc.get_objects() if _is_module(obj)]
    for obj in modules:
        params = [id(p) for p in obj.parameters()]
        covered = len(wanted.intersection(params))
        if covered == 0:
            continue
        places = sum(
            1 for _, p in obj.named_parameters(remove_duplicate=False) if id(p) in wanted
        )
        size = sum(1 for _ in obj.modules())
        # the outermost called model first; the rest by fewer submodules
        by_call = (0, -size) if id(obj) in called and not _is_wrapper(obj) else (1, size)
        key = (-covered, len(params), -places, by_call)
        if best is None or key < best:
            best, best_module = key, obj
    if best_module is None:
        raise LeversError(
            "levers found no torch.nn.Module holding the optimizer's parameters; pass the model "
            "explicitly (levers.capture_step(model, optimizer))"
        )
    return best_module


@contextlib.contextmanager
def forward_calls() -> Iterator[set[int]]:
    """Yield the set of the ids of the modules whose forward runs while inside (a global
    forward pre-hook; one set add per module call)."""
    seen: set[int] = set()
    handle = torch.nn.modules.module.register_module_forward_pre_hook(
        lambda module, args: seen.add(id(module))
    )
    try:
        yield seen
    finally:
        handle.remove()


class StepWatcher:
    """Counts optimizer steps and captures the whole step after ``warmup + timed`` of them.

    ``on_captured(capture)`` is called in the optimizer post hook that ends the captured step;
    it may raise :class:`StopTraining` to end the run there. ``on_step(num_steps, optimizer)``
    is called at every step boundary (the end of a primary optimizer step) before the capture's
    own bookkeeping; it may raise :class:`StopTraining` too.
    """

    def __init__(
        self,
        *,
        warmup: int,
        timed: int = 0,
        name: str = "script",
        params: dict[str, Any] | None = None,
        model: torch.nn.Module | None = None,
        tokens_per_step: int | None = None,
        on_captured: Callable[[Capture], None] | None = None,
        progress: Callable[[int, str], None] | None = None,
        on_step: Callable[[int, torch.optim.Optimizer], None] | None = None,
        mode: str | None = None,
    ) -> None:
        if warmup < 1:
            raise ValueError(
                f"warmup must be at least 1 (the capture starts at an optimizer step), got {warmup}"
            )
        if timed < 0:
            raise ValueError(f"timed must be >= 0, got {timed}")
        self.warmup = warmup
        self.timed = timed
        self.name = name
        self.params = dict(params or {})
        self.model = model
        self.tokens_per_step = tokens_per_step
        self.on_captured = on_captured
        self.progress = progress
        self.on_step = on_step
        self.mode = capture_mode(mode)
        self.num_steps = 0  # primary optimizer steps seen
        self.capture: Capture | None = None
        self.workload: Workload | None = None
        # the script's names for the model and optimizer, found when the capture starts
        self.names: ScriptNames | None = None
        self.primary: torch.optim.Optimizer | None = None
        self.optimizers: list[torch.optim.Optimizer] = []  # every one seen, in order of first step
        # what torch.compile did from here on is the script's (not an earlier run's in this process)
        self.compiled_before = compile_stats.snapshot()
        self._steps_in_capture: dict[int, int] = {}  # id(optimizer) -> steps in the captured step
        self._depth = 0
        self._innermost: torch.optim.Optimizer | None = None
        self._active: StepCapture | None = None
        self._recorded: Capture | None = None  # the content pass, while the timed pass runs
        self._timed: TimedPass | None = None
        self._step_s: list[float] = []
        self._t_last = 0.0
        self._handles: list[Any] = []
        # the modules whose forward ran in the second step (find_model's outermost model)
        self.called: set[int] = set()
        self._watching_calls: contextlib.ExitStack | None = None
        # the scalars the captured step passes to Tensor.backward: its loss (the script returns
        # none to levers), for the capture's settings["loss"] and the audit's NaN warning
        self._loss_tap: LossTap | None = None

    @property
    def steps_needed(self) -> int:
        return self.warmup + self.timed + 1

    @property
    def capturing(self) -> bool:
        return self._active is not None

    def install(self) -> None:
        self._handles = [
            register_optimizer_step_pre_hook(self._pre),
            register_optimizer_step_post_hook(self._post),
        ]

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self._stop_watching_calls()
        self._take_loss()
        if self._active is not None:  # the run ended inside the step being captured
            self._active.abort()
            self._active = None
        if self._timed is not None:  # the run ended inside the timed pass: keep the recorded step
            self._timed.abort()
            self._timed = None
            assert self._recorded is not None
            self.capture = self._with_names(self._with_params(_with_reason(
                self._recorded, "the run ended after the recorded step: no step was left to time"
            )))

    def __enter__(self) -> StepWatcher:
        self.install()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()

    def saw(self) -> str:
        """One line on how far the run got, for when no step was captured."""
        if self.num_steps == 0:
            seen = "levers saw no optimizer step (torch.optim.Optimizer.step was never called)"
        else:
            plural = "" if self.num_steps == 1 else "s"
            seen = f"levers saw {self.num_steps} optimizer step{plural}"
        return f"{seen}; needed {self.steps_needed} ({self._needed_text()})"

    def _needed_text(self) -> str:
        parts = [f"--warmup {self.warmup}"]
        if self.timed:
            parts.append(f"--timed {self.timed}")
        return ", ".join(parts) + ", then the step to capture"

    # --- the hooks -------------------------------------------------------------------------

    def _pre(self, optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> Any:
        self._depth += 1
        if self._depth == 1:
            self._innermost = None
        if self._active is None:
            return None
        self._active.enter_optimizer()
        return self._wrap_closure(args, kwargs)

    def _wrap_closure(self, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        active = self._active
        assert active is not None

        def unwrap(closure: Callable[..., Any]) -> Callable[..., Any]:
            @functools.wraps(closure)
            def run(*a: Any, **k: Any) -> Any:
                active.exit_optimizer()  # the closure's forward and backward are not optimizer
                try:
                    return closure(*a, **k)
                finally:
                    active.enter_optimizer()

            return run

        if callable(kwargs.get("closure")):
            return args, {**kwargs, "closure": unwrap(kwargs["closure"])}
        if len(args) > 1 and callable(args[1]):  # args[0] is the optimizer itself
            return (args[0], unwrap(args[1]), *args[2:]), kwargs
        return None

    def _post(self, optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        if self._active is not None:
            self._active.exit_optimizer()
        if self._innermost is None:
            self._innermost = optimizer  # the first post hook of a nest is the innermost step
        self._depth = max(self._depth - 1, 0)
        if self._depth > 0:
            return
        inner = self._innermost
        if self.primary is None:
            self.primary = inner
        if all(inner is not seen for seen in self.optimizers):
            self.optimizers.append(inner)
        if inner is not self.primary:
            if self._active is not None:
                self._steps_in_capture[id(inner)] = self._steps_in_capture.get(id(inner), 0) + 1
            return
        self._boundary(inner)

    def _stop_watching_calls(self) -> None:
        if self._watching_calls is not None:
            self._watching_calls.close()
            self._watching_calls = None

    def _boundary(self, optimizer: torch.optim.Optimizer) -> None:
        self.num_steps += 1
        if self.num_steps == 1 and self.model is None:
            # one whole step's module calls (the second), for the model find_model picks
            self._watching_calls = contextlib.ExitStack()
            self.called = self._watching_calls.enter_context(forward_calls())
        elif self.num_steps == 2:
            self._stop_watching_calls()
        if self.on_step is not None:
            self.on_step(self.num_steps, optimizer)
        start_capture = self.warmup + self.timed
        if self.warmup < self.num_steps <= start_capture:
            self._sync()
            now = time.perf_counter()
            self._step_s.append(now - self._t_last)
            self._t_last = now
        if self.num_steps == self.warmup:
            self._sync()
            self._t_last = time.perf_counter()
        if self.num_steps == start_capture:
            self._start(optimizer)
        elif self.num_steps == start_capture + 1 and self._active is not None:
            active, self._active = self._active, None
            recorded = active.stop(
                step_s=tuple(self._step_s), reason="the one-pass mode was asked for"
            )
            recorded = dataclasses.replace(
                recorded, settings={**recorded.settings, "loss": self._take_loss()}
            )
            if self.mode == "one-pass":
                self._captured(recorded)
            else:
                assert self.workload is not None
                self._recorded = recorded
                self._timed = TimedPass(self.workload.device)
                self._timed.start()
        elif self.num_steps == start_capture + 2 and self._timed is not None:
            timed, self._timed = self._timed, None
            assert self._recorded is not None
            self._captured(join_passes(self._recorded, timed.stop()))

    def _captured(self, capture: Capture) -> None:
        assert self.workload is not None
        self.capture = with_applicability(
            self._with_names(self._with_params(capture)), self.workload
        )
        if self.on_captured is not None:
            self.on_captured(self.capture)

    def _with_params(self, capture: Capture) -> Capture:
        said = self.captured_text()
        if said is None:
            return capture
        params = {**capture.workload_params, "captured": said}
        return dataclasses.replace(capture, workload_params=params)

    def _with_names(self, capture: Capture) -> Capture:
        if self.names is None:
            return capture
        settings = {**capture.settings, SCRIPT_NAMES: self.names.to_dict()}
        return dataclasses.replace(capture, settings=settings)

    def captured_text(self) -> str | None:
        """What the captured step spans when more than one optimizer steps, else None."""
        if len(self.optimizers) < 2 or self.primary is None:
            return None
        names = _optimizer_names(self.optimizers)
        primary = names[id(self.primary)]
        others = []
        for optimizer in self.optimizers:
            if optimizer is self.primary:
                continue
            count = self._steps_in_capture.get(id(optimizer), 0)
            times = {0: "0 times (it steps on other iterations)", 1: "once"}.get(count, f"{count} times")
            others.append(f"{names[id(optimizer)]}.step() {times}")
        return (
            f"one whole iteration of {len(self.optimizers)} optimizers: from "
            f"{primary}.step() to its next, with {', '.join(others)} inside it"
        )

    def _take_loss(self) -> float | None:
        """The captured step's loss, read once the step is over; the tap comes off."""
        tap, self._loss_tap = self._loss_tap, None
        if tap is None:
            return None
        tap.__exit__(None, None, None)
        return loss_of(tap.take())

    def _sync(self) -> None:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()  # sync point: a timing boundary between steps

    def _start(self, optimizer: torch.optim.Optimizer) -> None:
        # the model covers every optimizer seen so far: two optimizers may train two halves
        model = self.model if self.model is not None else find_model(
            optimizer, *self.optimizers, called=self.called
        )
        # inside the script's optimizer.step(): its frames are on the stack
        self.names = find_names(model, optimizer)
        self.workload = Workload(
            model=model,
            step=functools.partial(_no_step),  # no __code__: no step source to read
            optimizer=optimizer,
            tokens_per_step=self.tokens_per_step,
            name=self.name,
            params=self.params,
        )
        self._active = StepCapture(
            self.workload, progress=self.progress, optimizer_hooks=False,
            compiled_before=self.compiled_before,
        )
        self._loss_tap = LossTap(copy=False).__enter__()
        self._loss_tap.recording = True
        self._active.start()
