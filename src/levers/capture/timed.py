"""The timed pass of a two-pass capture, and its join with the content pass.

The content pass records one step under the op recorder (:class:`levers.capture.step.StepCapture`):
every field of every op, at a host cost of tens of microseconds per op. The timed pass runs the
next step under ``torch.profiler`` alone (no dispatch mode, no function mode, no range per op:
no Python runs per op), so its wall time is the step's with the profiler's cost only, and on a
GPU its kernels ran as they run in training. The capture keeps the content pass's ops and calls,
and takes from the timed pass the captured step's time and, on a GPU, the kernels, each op's
device time and the allocator's bytes after each op, joined through the alignment of the two
op streams (:mod:`levers.capture.align`). Where too few ops align the two steps were not the
same step, and the content pass's own one-pass capture is kept (it says why).

To align, this module reads the profiler's C++ event tree
(``kineto_results.experimental_event_tree()``; ``prof.events()`` builds Python objects for
every event and takes seconds) and finds in it the ops a dispatch mode would see: an op event
whose operator has a ``CompositeImplicitAutograd`` kernel decomposes above the Python key, so
the ops it calls are the ones a mode sees; any other op event is one op, and what it calls runs
below the mode, but for autocast's casts of its inputs, which a mode sees as ops of their own
(:func:`_autocast_casts`). Events that are not operators (autograd nodes, ``record_function`` ranges) are
walked into.

A kernel names (its linked correlation id) the innermost op event running when it was
launched; its op is the op event above that one that a dispatch mode would see.
"""

from __future__ import annotations

import dataclasses
import re
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch._C._profiler import _EventType

from levers.capture import gpu
from levers.capture.align import align, kernel_ops
from levers.capture.collectives import COLLECTIVE_PREFIXES
from levers.capture.records import Capture, CapturePasses, MemoryStats, peak_op

_OPERATOR = re.compile(r"^(\w+)::(\w+)$")  # "aten::add_"; not "autograd::engine::..." nor "detach"
_NOT_OPS = ("profiler",)
_CASTS = ("aten::to", "aten::_to_copy", "aten::copy_")  # namespaces of the profiler's own ranges, which the recorder skips too
# "c10d::allreduce_": the profiler's names of the ops collectives.COLLECTIVE_PREFIXES names
_COLLECTIVE_EVENTS = tuple(prefix.replace(".", "::") for prefix in COLLECTIVE_PREFIXES)
_has_kernel = torch._C._dispatch_has_kernel_for_dispatch_key
_decomposes: dict[str, bool] = {}
# below this share of the content pass's ops aligned, the passes ran different steps
MIN_COVERAGE = 0.8


@dataclass(frozen=True)
class OpEvent:
    """One op of the timed step, as the profiler recorded it."""

    name: str  # "aten::add_"
    input_shapes: tuple[tuple[int, ...], ...]  # of the tensor inputs, lists flattened
    start_ns: int  # profiler clock
    end_ns: int


@dataclass(frozen=True)
class TimedOps:
    """The timed step's ops in the order they started, and which op each event belongs to."""

    ops: tuple[OpEvent, ...]
    # correlation id of an op event or one below it -> position (empty when kernels were not asked)
    op_of_correlation: dict[int, int]
    # position of a cast taken out of an op's event (_autocast_casts) -> that op's position
    cast_of: dict[int, int] = dataclasses.field(default_factory=dict)


def decomposes(name: str) -> bool:
    """Whether the operator ``name`` ("aten::linear") runs as other ops above the Python key (a
    dispatch mode sees those, not it). The profiler names an op without its overload: the
    default overload is asked where there is one, else whether any but the ``out=`` variants
    decomposes (an approximation; ``aten::to`` has no default)."""
    known = _decomposes.get(name)
    if known is None:
        namespace, _, op = name.partition("::")
        packet = getattr(getattr(torch.ops, namespace, None), op, None)
        overloads = packet.overloads() if packet is not None else []
        if "default" in overloads:
            qualified = [name]
        else:
            qualified = [f"{name}.{o}" for o in overloads if not o.startswith("out")]
        try:
            known = any(_has_kernel(q, "CompositeImplicitAutograd") for q in qualified)
        except RuntimeError:  # not an operator the dispatcher knows
            known = False
        _decomposes[name] = known
    return known


def timed_ops(prof: Any, *, kernels: bool) -> TimedOps:
    """The ops a dispatch mode would have recorded in the profiled step, in order; with
    ``kernels``, the correlation ids that join kernels to them (a walk of every event below)."""
    torch_op = _EventType.TorchOp
    # (start_ns, order among the events of one op, event, correlation ids below it, the op a
    # cast was taken out of)
    found: list[tuple[int, int, Any, Any, Any]] = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        event = stack.pop()
        if event.tag != torch_op:
            continue  # allocations, Python calls, device activity: no op
        match = _OPERATOR.match(event.name)
        if match is not None and match.group(1) not in _NOT_OPS:
            if not decomposes(event.name):
                casts = _autocast_casts(event)
                cast_ids: set[int] = set()
                for order, cast in enumerate(casts):
                    ids = _correlation_ids(cast) if kernels else []
                    cast_ids.update(ids)
                    found.append((event.start_time_ns, order, cast, ids, event))
                ids = _correlation_ids(event) if kernels else []
                found.append((
                    event.start_time_ns, len(casts), event,
                    [i for i in ids if i not in cast_ids], None,
                ))
                continue
        stack.extend(event.children)
    found.sort(key=lambda item: (item[0], item[1]))
    position_of = {id(item[2]): position for position, item in enumerate(found)}
    cast_of = {
        position: position_of[id(item[4])]
        for position, item in enumerate(found)
        if item[4] is not None
    }
    ops = []
    op_of_correlation: dict[int, int] = {}
    for position, (start_ns, _, event, correlation_ids, _) in enumerate(found):
        ops.append(OpEvent(
            name=event.name,
            input_shapes=_input_shapes(event.extra_fields.inputs),
            start_ns=start_ns,
            end_ns=event.end_time_ns,
        ))
        for correlation_id in correlation_ids:
            op_of_correlation[correlation_id] = position
    return TimedOps(ops=tuple(ops), op_of_correlation=op_of_correlation, cast_of=cast_of)


def _autocast_casts(event: Any) -> list[Any]:
    """The ``_to_copy`` events autocast ran for ``event``'s inputs, in order: the leading
    ``aten::to``/``aten::_to_copy`` children of an op event. Autocast sits above the Python key,
    so a dispatch mode sees its casts as ops of their own, before the op (``_to_copy``, then
    ``addmm``), where the profiler records them inside the op's event; they are taken out so the
    two streams align and the casts' kernels stay theirs. Empty for an op that is itself a cast."""
    if event.name in _CASTS:
        return []
    casts = []
    for child in event.children:
        if child.tag != _EventType.TorchOp:
            continue
        if child.name == "aten::_to_copy":
            casts.append(child)
        elif child.name == "aten::to":
            casts.extend(
                c for c in child.children
                if c.tag == _EventType.TorchOp and c.name == "aten::_to_copy"
            )
        else:
            break  # the op's own work has begun: later calls are its implementation's
    return casts


def _correlation_ids(event: Any) -> list[int]:
    """The correlation ids of ``event`` and of every op event below it."""
    ids = []
    stack = [event]
    while stack:
        node = stack.pop()
        if node.tag == _EventType.TorchOp:
            ids.append(node.correlation_id)
        stack.extend(node.children)
    return ids


def _input_shapes(inputs: list[Any]) -> tuple[tuple[int, ...], ...]:
    shapes = []
    for value in inputs:
        for item in value if isinstance(value, list) else (value,):
            if isinstance(item, torch._C._profiler._TensorMetadata):
                shapes.append(tuple(item.sizes))
    return tuple(shapes)


@dataclass(frozen=True)
class TimedStep:
    """What the timed pass measured of its step."""

    device: torch.device
    step_s: float
    ops: TimedOps
    device_events: tuple[gpu.DeviceEvent, ...]  # empty on a CPU
    profiler: Any  # the ended profile, for the allocator's events on a GPU
    memory: MemoryStats | None  # the allocator's figures on a GPU; None on a CPU


class TimedPass:
    """Times one step under the profiler alone; :meth:`stop` reads what it saw."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._profiler: Any = None
        self._start_bytes = 0
        self._t0 = 0.0

    def start(self) -> None:
        on_cuda = self.device.type == "cuda"
        if on_cuda:
            gpu.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._start_bytes = torch.cuda.memory_allocated(self.device)
        self._profiler = gpu.timed_profiler(on_cuda)
        self._profiler.__enter__()
        gpu.synchronize(self.device)
        self._t0 = time.perf_counter()

    def abort(self) -> None:
        """End the pass without reading it (the step raised, or the run ended)."""
        if self._profiler is not None:
            self._profiler.__exit__(None, None, None)
            self._profiler = None

    def stop(self) -> TimedStep:
        assert self._profiler is not None, "stop() before start()"
        device = self.device
        gpu.synchronize(device)
        step_s = time.perf_counter() - self._t0
        prof, self._profiler = self._profiler, None
        prof.__exit__(None, None, None)
        on_cuda = device.type == "cuda"
        return TimedStep(
            device=device,
            step_s=step_s,
            ops=timed_ops(prof, kernels=on_cuda),
            device_events=tuple(gpu.device_events(prof)) if on_cuda else (),
            profiler=prof,
            memory=gpu.allocator_memory(device, self._start_bytes) if on_cuda else None,
        )


def join_passes(content: Capture, timed: TimedStep) -> Capture:
    """The two-pass capture: ``content`` (the content pass's capture) with the timed pass's
    step time and, on a GPU, its kernels, device time and allocator bytes joined to the ops.
    Where fewer than ``MIN_COVERAGE`` of the ops align, ``content`` as a one-pass capture."""
    ops = content.ops
    alignment = align(
        [(op.name, tuple(m.shape for m in op.inputs)) for op in ops],
        [(e.name, e.input_shapes) for e in timed.ops.ops],
    )
    coverage = alignment.num_aligned / len(ops) if ops else 1.0
    passes = CapturePasses(
        mode="two-pass",
        content_step_s=content.timing.captured_step_s,
        num_timed_ops=len(timed.ops.ops),
        num_aligned_ops=alignment.num_aligned,
        coverage=coverage,
    )
    if coverage < MIN_COVERAGE:
        reason = (
            f"the timed step's ops aligned with {coverage:.0%} of the recorded step's (under "
            f"{MIN_COVERAGE:.0%}): the two steps differ, so the recorded step's own timing and "
            "kernels are kept"
        )
        return dataclasses.replace(
            content, passes=dataclasses.replace(passes, mode="one-pass", reason=reason)
        )
    timing = dataclasses.replace(content.timing, captured_step_s=timed.step_s)
    if timed.memory is None:  # a CPU: no kernels; the ops' live bytes are the tracked storages'
        return dataclasses.replace(content, timing=timing, passes=passes)

    op_of_correlation = timed.ops.op_of_correlation
    launched_by = [op_of_correlation.get(e.correlation_id) for e in timed.device_events]
    # a cast taken out of an op's event that no recorded op matches was the op's own (a native
    # kernel's internal .to(), not autocast's): its kernels go back to that op
    cast_of = timed.ops.cast_of
    launched_by = [
        cast_of[p] if p in cast_of and alignment.content_of_timed[p] is None else p
        for p in launched_by
    ]
    op_indices, num_to_neighbour = kernel_ops(
        launched_by,
        alignment,
        [op.is_view for op in ops],
        [e.name.startswith(_COLLECTIVE_EVENTS) for e in timed.ops.ops],
    )
    device_us, kernels = gpu.kernel_records(list(timed.device_events), op_indices)
    end_ns = {
        index: timed.ops.ops[position].end_ns
        for position, index in enumerate(alignment.content_of_timed)
        if index is not None
    }
    live_bytes = gpu.allocated_after_ops(
        timed.profiler, gpu.indexed(timed.device), end_ns, len(ops),
        timed.memory.start_bytes,
    )
    ops = tuple(
        dataclasses.replace(op, device_us=device_us.get(op.index, 0.0), live_bytes=live_bytes[i])
        for i, op in enumerate(ops)
    )
    return dataclasses.replace(
        content,
        timing=timing,
        ops=ops,
        kernels=tuple(kernels),
        memory=dataclasses.replace(timed.memory, peak_op=peak_op(ops)),
        passes=dataclasses.replace(passes, num_kernels_to_neighbour=num_to_neighbour),
    )
