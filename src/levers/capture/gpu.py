"""GPU kernels and allocator bytes joined to the ops, through PyTorch's profiler.

In a one-pass capture each recorded op runs inside a profiler range named ``levers#<index>``;
the profiler attaches every kernel to the CPU op that launched it, so the kernels under a range
are that op's kernels and their summed duration is the op's device time. In a two-pass capture
the timed pass has no ranges: each kernel's launching op event is aligned with a recorded op
(:mod:`levers.capture.timed`, :mod:`levers.capture.align`) and :func:`kernel_records` joins them.

The profiler also records every allocation and free of the caching allocator with the
allocator's total after it (``profile_memory``), so the bytes allocated right after an op are the
total of the last allocator event before its range closed: the figure
``torch.cuda.memory_allocated()`` would give there, without a host call per op during the step.
"""

from __future__ import annotations

import bisect
import contextlib
import os
import re
import sys
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch._C._profiler import _EventType
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from levers.capture.records import KernelRecord, MemoryStats

_PREFIX = "levers#"
_MEMORY_EVENTS = ("[memory]", "[OutOfMemory]")  # allocator events, not kernels or ops


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # sync point: timing boundary, outside the step


def indexed(device: torch.device) -> torch.device:
    """``cuda`` as ``cuda:N``, the form the profiler's allocator events carry."""
    if device.index is not None or device.type != "cuda":
        return device
    return torch.device(device.type, torch.cuda.current_device())


def allocator_memory(
    device: torch.device, start_bytes: int, peak_op: int | None = None
) -> MemoryStats:
    """The caching allocator's figures of a step that started with ``start_bytes`` allocated
    (its peaks reset then)."""
    return MemoryStats(
        source="cuda-allocator",
        start_bytes=start_bytes,
        peak_bytes=torch.cuda.max_memory_allocated(device),
        end_bytes=torch.cuda.memory_allocated(device),
        peak_reserved_bytes=torch.cuda.max_memory_reserved(device),
        peak_op=peak_op,
    )


def range_marker() -> Callable[[int], Any]:
    """A factory of cheap profiler ranges, one per op index."""
    fast = getattr(torch._C._profiler, "_RecordFunctionFast", None)
    if fast is not None:
        return lambda index: fast(f"{_PREFIX}{index}")
    return lambda index: torch.profiler.record_function(f"{_PREFIX}{index}")


# the lines the profiler's library (Kineto) writes to the process's stderr as it starts and
# stops ("USDT:2026-12-04 03:58:09 10250:10250 SyncActivityProfilerHandler.cpp:52]
# profiler_start"): no setting silences them, and they fell amid every audit's output
_PROFILER_MARKER = re.compile(rb"^[A-Z]+:\d{4}-\d\d-\d\d \S+ \d+:\d+ \S+\.cpp:\d+\] ")


@contextlib.contextmanager
def _profiler_markers_dropped() -> Iterator[None]:
    """Drop the profiler's own marker lines that the block writes to the stderr file
    descriptor; anything else written there meanwhile is written on, in order."""
    try:
        sys.stderr.flush()
        fd = sys.__stderr__.fileno() if sys.__stderr__ is not None else 2
        saved = os.dup(fd)
    except (OSError, ValueError, AttributeError):  # no descriptor to redirect (an embedded host)
        yield
        return
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), fd)
        try:
            yield
        finally:
            os.dup2(saved, fd)
            os.close(saved)
            held.seek(0)
            kept = [line for line in held.read().splitlines(keepends=True)
                    if not _PROFILER_MARKER.match(line)]
            if kept:
                os.write(fd, b"".join(kept))


class QuietProfile(profile):
    """torch.profiler.profile whose start and stop leave no marker lines on stderr."""

    def start(self) -> None:
        with _profiler_markers_dropped():
            super().start()

    def stop(self) -> None:
        with _profiler_markers_dropped():
            super().stop()


def kernel_profiler() -> profile:
    return QuietProfile(
        activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], profile_memory=True
    )


def timed_profiler(on_cuda: bool) -> profile:
    """The timed pass's profiler: op events with their input shapes (to align them with the
    recorded ops) and, on a GPU, the kernels and the allocator's events."""
    activities = [ProfilerActivity.CPU]
    if on_cuda:
        activities.append(ProfilerActivity.CUDA)
    return QuietProfile(activities=activities, record_shapes=True, profile_memory=on_cuda)


@dataclass(frozen=True)
class DeviceEvent:
    """A kernel (or copy, or memset) the device ran, with the CPU op event that launched it."""

    name: str
    start_ns: int
    end_ns: int
    correlation_id: int  # of the innermost op event running when it was launched


@dataclass(frozen=True)
class ProfiledOps:
    """What the profiler saw of the recorded ops."""

    device_us: dict[int, float]  # op index -> summed duration of its kernels
    kernels: list[KernelRecord]  # every kernel, with the op it belongs to
    end_ns: dict[int, int]  # op index -> when its range closed (profiler clock)


def join_kernels(prof: profile) -> tuple[dict[int, float], list[KernelRecord]]:
    """(device microseconds per op index, every kernel with the op it belongs to)."""
    joined = read_profile(prof)
    return joined.device_us, joined.kernels


def read_profile(prof: profile) -> ProfiledOps:
    """Join the profiler's kernels to the ``levers#`` ranges of the ops.

    Reads the profiler's raw events: building its ``FunctionEvent`` tree costs seconds for a
    step of a few thousand ops (and that tree attaches more to a range than its kernels); the
    join below takes a fraction of that.
    """
    return _join_raw(prof.profiler.kineto_results.events())


def allocated_after_ops(
    prof: profile, device: torch.device, end_ns: dict[int, int], num_ops: int, start_bytes: int
) -> list[int]:
    """Bytes allocated on ``device`` right after each op: the allocator's total at its last
    event before the op's range closed (``start_bytes`` before any event)."""
    times_ns, totals = _allocator_totals(prof, device)
    if not times_ns and num_ops:
        warnings.warn(
            f"levers: the profiler recorded no allocations on {device} during the step; every "
            "op's live_bytes is the allocated figure at the start of the step",
            stacklevel=2,
        )
    after: list[int] = []
    previous = start_bytes
    for index in range(num_ops):
        t_ns = end_ns.get(index)
        if t_ns is not None:  # every recorded op has a range; else it moved nothing we saw
            pos = bisect.bisect_right(times_ns, t_ns) - 1
            previous = totals[pos] if pos >= 0 else start_bytes
        after.append(previous)
    return after


def _allocator_totals(prof: profile, device: torch.device) -> tuple[list[int], list[int]]:
    """(time_ns, total allocated bytes after the event) of every allocator event on ``device``,
    in time order. The raw event list carries sizes but not totals; the event tree has both."""
    events = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        if node.tag == _EventType.Allocation:
            fields = node.extra_fields
            if fields.device == device:
                events.append((node.start_time_ns, fields.total_allocated))
        else:
            stack.extend(node.children)
    events.sort()
    return [t for t, _ in events], [total for _, total in events]


def _join_raw(events: Any) -> ProfiledOps:
    """Each device event names (linked correlation id) the CPU op that launched it; that op
    runs on some thread at some time, inside at most one ``levers#`` range of that thread."""
    ranges: dict[int, list[tuple[int, int, int]]] = {}  # thread -> [(start_ns, end_ns, index)]
    launchers: dict[int, tuple[int, int]] = {}  # correlation id -> (thread, start_ns)
    end_ns: dict[int, int] = {}
    raw_device = []
    for e in events:
        name = e.name()
        if name in _MEMORY_EVENTS:
            continue
        if e.device_type() != DeviceType.CPU:
            # the profiler mirrors each CPU range on the device timeline ("gpu_user_annotation"):
            # a span, not a kernel
            if not _is_annotation(e):
                raw_device.append(e)
            continue
        if e.linked_correlation_id() != 0:
            continue  # a runtime call (cudaLaunchKernel): its op is found through the kernel
        thread = e.start_thread_id()
        if name.startswith(_PREFIX):
            index = int(name[len(_PREFIX):])
            ranges.setdefault(thread, []).append((e.start_ns(), e.end_ns(), index))
            end_ns[index] = e.end_ns()
        launchers[e.correlation_id()] = (thread, e.start_ns())
    for spans in ranges.values():
        spans.sort()
    starts = {thread: [s[0] for s in spans] for thread, spans in ranges.items()}

    op_indices: list[int | None] = []
    for e in raw_device:
        index = None
        launcher = launchers.get(e.linked_correlation_id())
        if launcher is not None and launcher[0] in ranges:
            thread, t_ns = launcher
            pos = bisect.bisect_right(starts[thread], t_ns) - 1
            if pos >= 0:
                range_start_ns, range_end_ns, candidate = ranges[thread][pos]
                if range_start_ns <= t_ns <= range_end_ns:
                    index = candidate
        op_indices.append(index)
    per_op_us, kernels = kernel_records(
        [DeviceEvent(e.name(), e.start_ns(), e.end_ns(), e.linked_correlation_id())
         for e in raw_device],
        op_indices,
    )
    return ProfiledOps(device_us=per_op_us, kernels=kernels, end_ns=end_ns)


def device_events(prof: profile) -> list[DeviceEvent]:
    """Every kernel, copy and memset of a profiled region, in the order the profiler lists them."""
    return [
        DeviceEvent(e.name(), e.start_ns(), e.end_ns(), e.linked_correlation_id())
        for e in prof.profiler.kineto_results.events()
        if e.device_type() != DeviceType.CPU
        and e.name() not in _MEMORY_EVENTS
        and not _is_annotation(e)
    ]


def kernel_records(
    events: list[DeviceEvent], op_indices: list[int | None]
) -> tuple[dict[int, float], list[KernelRecord]]:
    """(device microseconds per op index, every kernel) for ``events``, the i-th launched by
    op ``op_indices[i]`` (None: by no op)."""
    per_op_us: dict[int, float] = {}
    kernels: list[KernelRecord] = []
    first_ns = min((e.start_ns for e in events), default=0)
    for e, index in zip(events, op_indices, strict=True):
        dur_us = (e.end_ns - e.start_ns) / 1000.0
        if index is not None:
            per_op_us[index] = per_op_us.get(index, 0.0) + dur_us
        kernels.append(KernelRecord(
            name=e.name, device_us=dur_us, op_index=index, start_us=(e.start_ns - first_ns) / 1000.0
        ))
    return per_op_us, kernels


def summed_kernel_us(prof: profile) -> float:
    """Total device time of every kernel (and copy) a profiled region ran, in microseconds."""
    return sum((e.end_ns - e.start_ns) / 1000.0 for e in device_events(prof))


def _is_annotation(event: Any) -> bool:
    if event.name().startswith(_PREFIX):
        return True
    is_annotation = getattr(event, "is_user_annotation", None)
    return bool(is_annotation()) if is_annotation is not None else False
