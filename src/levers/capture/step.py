"""Capture one training step: warm up, time plain steps, then record one step in full.

The captured step is an ordinary step of the user's training: levers only observes it (a
dispatch mode, a function mode, module and optimizer hooks and, on a GPU, the profiler), so the
parameters and optimizer state after it are bitwise equal to those after an uncaptured step.

Two passes by default (:mod:`levers.capture.timed`): the step recorded in full, untimed, then
the next step timed under the profiler alone. ``mode="one-pass"`` (or
``LEVERS_CAPTURE=one-pass``) records and times one step under the op recorder, as levers did
before.
"""

from __future__ import annotations

import contextlib
import os
import time
import traceback
from typing import Any, Callable, Iterator

import torch
from torch.nn.modules.module import (
    register_module_forward_hook,
    register_module_forward_pre_hook,
)
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)

from levers.capture import gpu
from levers.capture.calls import CallRecorder, memory_metric_calls
from levers.capture import compile_stats
from levers.capture.env import settings
from levers.environment import environment
from levers.capture.loss import find_loss
from levers.capture.timed import TimedPass, join_passes
from levers.capture.records import (
    SCHEMA_VERSION,
    Capture,
    CapturePasses,
    MemoryStats,
    StepTiming,
    peak_op,
)
from levers.capture.recorder import (
    CaptureInternalError,
    LiveStorages,
    OpRecorder,
    make_recorder,
)
from levers.errors import EmptyStep, LeversError, StepError, user_traceback
from levers.user_code import is_builtin_workload_file, is_user_file
from levers.workload import Workload
from levers.vocab import COUNTED, MEASURED, TRACKED, UNAVAILABLE

MODES = ("two-pass", "one-pass")
MODE_VARIABLE = "LEVERS_CAPTURE"


def run_step_or_error(workload: Workload) -> Any:
    """One call of the workload's step; what it raises becomes a :class:`StepError` that says
    whose code failed (the user's, with its traceback, or a built-in workload's) and what to do."""
    try:
        return workload.step()
    except CaptureInternalError:
        raise
    except torch.OutOfMemoryError as exc:
        # not the step's code: its size on this device, whoever wrote it
        raise StepError(
            f"the step of workload {workload.name!r} ran out of the GPU's memory at its "
            f"parameters ({_params_text(workload.params)}): {str(exc).split('. GPU')[0]}. "
            "Lower batch_size or seq_len: `levers memory ... --gpu GPU --fit` finds the largest "
            "batch that fits, predicted without allocating it; levers audits, A/Bs and tunes "
            "the step you give it at the size you give it"
        ) from exc
    except Exception as exc:
        if _raised_in_builtin(exc):
            if isinstance(exc, LeversError):
                raise StepError(str(exc)) from exc  # a built-in that says what it cannot do
            # levers' own step: its traceback is no lead for the user, and "fix the step" no help
            raise StepError(
                f"the step of the built-in workload {workload.name!r} raised "
                f"{type(exc).__name__}: {exc}; at its parameters "
                f"({_params_text(workload.params)}) it does not run here: if it ran out of memory, "
                "lower batch_size or seq_len (levers memory predicts the step's peak without "
                "allocating it), else report it as a bug in levers"
            ) from exc
        raise StepError(
            f"the step of workload {workload.name!r} raised {type(exc).__name__}: {exc}; "
            "fix the step (the traceback below shows where) and run again",
            user_traceback=user_traceback(exc),
        ) from exc


def _raised_in_builtin(exc: BaseException) -> bool:
    """Whether the innermost user frame of ``exc`` is in a built-in workload."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if is_user_file(f.filename)]
    return bool(frames) and is_builtin_workload_file(frames[-1].filename)


def _params_text(params: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in params.items()) or "its defaults"


def capture_mode(mode: str | None = None) -> str:
    """``mode``, else ``$LEVERS_CAPTURE``, else "two-pass".

    Raises:
        ValueError: not one of :data:`MODES`.
    """
    chosen = mode or os.environ.get(MODE_VARIABLE) or MODES[0]
    if chosen not in MODES:
        source = f"mode={mode!r}" if mode else f"{MODE_VARIABLE}={chosen!r}"
        raise ValueError(f"{source} is not a capture mode; use one of {', '.join(MODES)}")
    return chosen


def _timed_step(workload: Workload) -> float:
    gpu.synchronize(workload.device)
    t0 = time.perf_counter()
    run_step_or_error(workload)
    gpu.synchronize(workload.device)
    return time.perf_counter() - t0


def _state_tensors(workload: Workload) -> Iterator[torch.Tensor]:
    """Tensors alive before the step: parameters, gradients, buffers, optimizer state."""
    for p in workload.model.parameters():
        yield p
        if p.grad is not None:
            yield p.grad
    yield from workload.model.buffers()
    if workload.optimizer is not None:
        for state in workload.optimizer.state.values():
            yield from (v for v in state.values() if isinstance(v, torch.Tensor))


@contextlib.contextmanager
def _optimizer_phase(recorder: OpRecorder, optimizer: torch.optim.Optimizer | None) -> Iterator[None]:
    """Label ops inside any optimizer's step (and the workload optimizer's zero_grad)."""
    pre = register_optimizer_step_pre_hook(recorder.enter_optimizer)
    post = register_optimizer_step_post_hook(recorder.exit_optimizer)
    try:
        with _zero_grad_phase(recorder, optimizer):
            yield
    finally:
        pre.remove()
        post.remove()


@contextlib.contextmanager
def _zero_grad_phase(recorder: OpRecorder, optimizer: torch.optim.Optimizer | None) -> Iterator[None]:
    """Label ops inside the workload optimizer's zero_grad as the optimizer phase."""
    patched = optimizer is not None and "zero_grad" not in vars(optimizer)
    if patched:
        original = optimizer.zero_grad

        def zero_grad(*args: Any, **kwargs: Any) -> Any:
            recorder.enter_optimizer()
            try:
                return original(*args, **kwargs)
            finally:
                recorder.exit_optimizer()

        optimizer.zero_grad = zero_grad  # type: ignore[method-assign]
    try:
        yield
    finally:
        if patched:
            del optimizer.zero_grad


try:  # inside a module that torch.compile optimizes, the hooks stay out (as ModTracker's do)
    from torch._dynamo.eval_frame import _is_in_optimized_module as _in_compiled_module
except ImportError:

    def _in_compiled_module() -> bool:
        return False


@contextlib.contextmanager
def _module_tracking(recorder: OpRecorder) -> Iterator[None]:
    """Keep the recorder's stack of running modules with global forward hooks.

    These are the hooks ModTracker's forward tracking is made of. ModTracker also registers
    gradient hooks on every module's inputs and outputs to follow modules in backward, which
    the recorder does not need (a backward op is attributed through its autograd node) and
    which cost more than the rest of the module tracking together.
    """

    def entered(module: torch.nn.Module, args: Any) -> None:
        if not _in_compiled_module():
            recorder.push_module(module)

    def left(module: torch.nn.Module, args: Any, output: Any) -> None:
        if not _in_compiled_module():
            recorder.pop_module(module)

    pre = register_module_forward_pre_hook(entered)
    post = register_module_forward_hook(left, always_call=True)  # also when forward raises
    try:
        yield
    finally:
        pre.remove()
        post.remove()


def enter_observers(
    stack: contextlib.ExitStack,
    recorder: OpRecorder,
    optimizer: torch.optim.Optimizer | None,
    *,
    optimizer_hooks: bool = True,
) -> None:
    """Enter the capture's observers of a step on ``stack``, innermost last: module tracking,
    the optimizer phase, the memory-metric and torch-call recorders, the op recorder. (The
    profiler, on a GPU, is the caller's.)"""
    stack.enter_context(_module_tracking(recorder))
    if optimizer_hooks:
        stack.enter_context(_optimizer_phase(recorder, optimizer))
    else:
        stack.enter_context(_zero_grad_phase(recorder, optimizer))
    stack.enter_context(memory_metric_calls(recorder))
    stack.enter_context(CallRecorder(recorder))
    stack.enter_context(recorder)


def capture_step(
    workload: Workload,
    *,
    warmup: int = 1,
    timed: int = 3,
    progress: Callable[[int, str], None] | None = None,
    ran_before: bool | None = None,
    mode: str | None = None,
) -> Capture:
    """Run ``warmup`` plain steps, ``timed`` timed plain steps, then capture one step: record
    it and, in the two-pass ``mode`` (see :func:`capture_mode`), time the step after it under
    the profiler alone. ``ran_before`` (default: whether any plain step ran here) says whether
    the step has run before the capture (see :class:`StepCapture`).

    Raises:
        ValueError: warmup or timed is negative, or mode is not a capture mode.
        StepError: the workload's step raised (with the user's traceback).
        EmptyStep: the step ran no torch op or call.
    """
    if warmup < 0 or timed < 0:
        raise ValueError(f"warmup and timed must be >= 0, got warmup={warmup}, timed={timed}")
    refuse_meta(workload)
    mode = capture_mode(mode)
    compiled_before = compile_stats.snapshot()
    for _ in range(warmup):
        run_step_or_error(workload)
    step_s = tuple(_timed_step(workload) for _ in range(timed))
    if ran_before is None:
        ran_before = warmup + timed > 0
    capture = StepCapture(
        workload, progress=progress, ran_before=ran_before, compiled_before=compiled_before
    )
    capture.start()
    try:
        returned = run_step_or_error(workload)
    except BaseException:
        capture.abort()
        raise
    content = capture.stop(
        step_s=step_s, returned=returned, reason="the one-pass mode was asked for"
    )
    # an empty step would audit to no finding, as if nothing were wrong with it
    if not content.ops and not content.calls:
        raise EmptyStep(
            f"the step of workload {workload.name!r} ran no torch op or call, so there is nothing "
            "to capture; make its step() run one whole training step (forward, loss.backward(), "
            "optimizer.step())"
        )
    if mode == "one-pass":
        return content
    timed_pass = TimedPass(workload.device)
    timed_pass.start()
    try:
        run_step_or_error(workload)
    except BaseException:
        timed_pass.abort()
        raise
    return join_passes(content, timed_pass.stop())


def refuse_meta(workload: Workload) -> None:
    """A step on the meta device has shapes and no values: there is nothing to run or time."""
    if workload.device is not None and torch.device(workload.device).type == "meta":
        raise LeversError(
            "the model is on the meta device: its step has shapes but no values, so there is "
            "nothing to capture; build it on a CPU or GPU (levers memory predicts a step's memory "
            "from shapes alone: levers memory path/to/file.py:factory --gpu h100)"
        )


class StepCapture:
    """The capture of one step, started and stopped where the caller decides.

    :func:`capture_step` starts it before ``workload.step()`` and stops it after. A script run
    starts it in one ``optimizer.step()``'s post hook and stops it in the next one's: there a
    new optimizer hook cannot be registered (torch is iterating over the hooks), so with
    ``optimizer_hooks=False`` the caller drives :meth:`enter_optimizer` / :meth:`exit_optimizer`
    from hooks of its own. ``workload.step`` is not called here. ``ran_before`` says whether the
    step has run before the capture (so anything it compiles is compiled by then).
    ``compiled_before`` is dynamo's state before the step first ran (default: the process's
    start, as for a script): what torch.compile did from then to the capture is kept.
    """

    def __init__(
        self,
        workload: Workload,
        *,
        progress: Callable[[int, str], None] | None = None,
        optimizer_hooks: bool = True,
        ran_before: bool = True,
        compiled_before: compile_stats.Snapshot | None = None,
    ) -> None:
        self.workload = workload
        self.progress = progress
        self.optimizer_hooks = optimizer_hooks
        self.ran_before = ran_before
        self.compiled_before = compiled_before or compile_stats.Snapshot()
        self._compile: dict[str, Any] | None = None
        self.recorder: OpRecorder | None = None
        self._stack: contextlib.ExitStack | None = None
        self._live: LiveStorages | None = None
        self._start_bytes = 0
        self._t0 = 0.0

    def enter_optimizer(self, *_: Any) -> None:
        if self.recorder is not None:
            self.recorder.enter_optimizer()

    def exit_optimizer(self, *_: Any) -> None:
        if self.recorder is not None:
            self.recorder.exit_optimizer()

    def start(self) -> None:
        workload = self.workload
        refuse_meta(workload)
        device = workload.device
        on_cuda = device.type == "cuda"
        # before the capture's own observers: what the user's steps compiled, not the capture's
        self._compile = compile_stats.since(self.compiled_before)
        stack = contextlib.ExitStack()
        try:
            if on_cuda:
                gpu.synchronize(device)
                torch.cuda.reset_peak_memory_stats(device)
                self._start_bytes = torch.cuda.memory_allocated(device)
            else:
                self._live = LiveStorages()
                for t in _state_tensors(workload):
                    self._live.track(t)
                self._start_bytes = self._live.live_bytes
            recorder = make_recorder(
                workload.model,
                guarded=not self.ran_before,
                optimizer=workload.optimizer,
                live=self._live,
                range_marker=gpu.range_marker() if on_cuda else None,
                progress=self.progress,
            )
            self.recorder = recorder
            self._profiler = gpu.kernel_profiler() if on_cuda else contextlib.nullcontext()
            stack.enter_context(self._profiler)
            enter_observers(
                stack, recorder, workload.optimizer, optimizer_hooks=self.optimizer_hooks
            )
        except BaseException:
            stack.close()
            raise
        self._stack = stack
        gpu.synchronize(device)
        self._t0 = time.perf_counter()

    def abort(self) -> None:
        """End the capture without assembling it (the step raised)."""
        if self._stack is not None:
            if self.recorder is not None:
                self.recorder.paused = True
                self.recorder.release()
            self._stack.close()
            self._stack = None

    def stop(
        self, *, step_s: tuple[float, ...] = (), returned: Any = None, reason: str | None = None
    ) -> Capture:
        """End the capture and assemble it as a one-pass capture; ``step_s`` are the plain steps
        timed before it, ``returned`` what the captured step returned (its loss is read from
        it) and ``reason`` why one pass (:func:`levers.capture.timed.join_passes` makes it the
        content pass of a two-pass capture)."""
        assert self._stack is not None and self.recorder is not None, "stop() before start()"
        workload, recorder = self.workload, self.recorder
        device = workload.device
        on_cuda = device.type == "cuda"
        try:
            gpu.synchronize(device)
            captured_s = time.perf_counter() - self._t0
            recorder.paused = True
        finally:
            self._stack.close()
            self._stack = None
        calls = recorder.finish_calls()

        if on_cuda:
            joined = gpu.read_profile(self._profiler)
            kernels = joined.kernels
            live_bytes = gpu.allocated_after_ops(
                self._profiler, gpu.indexed(device), joined.end_ns, recorder.num_ops,
                self._start_bytes,
            )
            ops = recorder.build_ops(device_us=joined.device_us, live_bytes=live_bytes)
            memory = gpu.allocator_memory(device, self._start_bytes, peak_op(ops))
        else:
            assert self._live is not None
            kernels = []
            ops = recorder.build_ops()
            memory = MemoryStats(
                source="tracked-storages",
                start_bytes=self._start_bytes,
                peak_bytes=max([self._start_bytes] + [op.live_bytes or 0 for op in ops]),
                end_bytes=self._live.live_bytes,
                peak_op=peak_op(ops),
            )

        return Capture(
            schema_version=SCHEMA_VERSION,
            workload=workload.name,
            workload_params=dict(workload.params),
            tokens_per_step=workload.tokens_per_step,
            env=environment(device),
            provenance=_provenance(on_cuda),
            timing=StepTiming(step_s=step_s, captured_step_s=captured_s),
            memory=memory,
            ops=tuple(ops),
            calls=tuple(calls),
            kernels=tuple(kernels),
            modules={name: type(m).__name__ for name, m in workload.model.named_modules()},
            settings={
                **settings(workload, recorder),
                "loss": _loss_value(returned),
                "compile": self._compile,
            },
            passes=CapturePasses(mode="one-pass", reason=reason),
        )


def _loss_value(returned: Any) -> float | None:
    """The captured step's loss as a float (after the step: the sync is outside its timing)."""
    loss = find_loss(returned).value
    return None if loss is None else float(loss)  # sync point: after the captured step


def _provenance(on_cuda: bool) -> dict[str, str]:
    return {
        "ops": MEASURED,  # every op that ran, as it ran
        "flops": COUNTED,  # analytic formulas over the recorded shapes
        "bytes": COUNTED,  # inputs read once, outputs written once
        "wall_time": MEASURED,
        "device_time": MEASURED if on_cuda else UNAVAILABLE,
        "peak_memory": MEASURED if on_cuda else TRACKED,
    }
