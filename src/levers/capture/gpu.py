"""GPU kernels joined to the ops that launched them, through PyTorch's profiler.

Each recorded op runs inside a profiler range named ``levers#<index>``; the profiler attaches
every kernel to the CPU op that launched it, so the kernels under a range are that op's kernels
and their summed duration is the op's device time.
"""

from __future__ import annotations

import bisect
from typing import Any, Callable

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from levers.capture.records import KernelRecord

_PREFIX = "levers#"


def range_marker() -> Callable[[int], Any]:
    """A factory of cheap profiler ranges, one per op index."""
    fast = getattr(torch._C._profiler, "_RecordFunctionFast", None)
    if fast is not None:
        return lambda index: fast(f"{_PREFIX}{index}")
    return lambda index: torch.profiler.record_function(f"{_PREFIX}{index}")


def kernel_profiler() -> profile:
    return profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])


def join_kernels(prof: profile) -> tuple[dict[int, float], list[KernelRecord]]:
    """(device microseconds per op index, every kernel with the op it belongs to).

    Reads the profiler's raw events: building its ``FunctionEvent`` tree costs seconds for a
    step of a few thousand ops (and that tree attaches more to a range than its kernels); the
    join below takes a fraction of that.
    """
    return _join_raw(prof.profiler.kineto_results.events())


def _join_raw(events: Any) -> tuple[dict[int, float], list[KernelRecord]]:
    """Each device event names (linked correlation id) the CPU op that launched it; that op
    runs on some thread at some time, inside at most one ``levers#`` range of that thread."""
    ranges: dict[int, list[tuple[int, int, int]]] = {}  # thread -> [(start_ns, end_ns, index)]
    launchers: dict[int, tuple[int, int]] = {}  # correlation id -> (thread, start_ns)
    device_events = []
    for e in events:
        if e.device_type() != DeviceType.CPU:
            # the profiler mirrors each CPU range on the device timeline ("gpu_user_annotation"):
            # a span, not a kernel
            if not _is_annotation(e):
                device_events.append(e)
            continue
        if e.linked_correlation_id() != 0:
            continue  # a runtime call (cudaLaunchKernel): its op is found through the kernel
        name = e.name()
        thread = e.start_thread_id()
        if name.startswith(_PREFIX):
            ranges.setdefault(thread, []).append((e.start_ns(), e.end_ns(), int(name[len(_PREFIX):])))
        launchers[e.correlation_id()] = (thread, e.start_ns())
    for spans in ranges.values():
        spans.sort()
    starts = {thread: [s[0] for s in spans] for thread, spans in ranges.items()}

    per_op_us: dict[int, float] = {}
    kernels: list[KernelRecord] = []
    first_ns = min((e.start_ns() for e in device_events), default=0)
    for e in device_events:
        dur_us = (e.end_ns() - e.start_ns()) / 1000.0
        index = None
        launcher = launchers.get(e.linked_correlation_id())
        if launcher is not None and launcher[0] in ranges:
            thread, t_ns = launcher
            pos = bisect.bisect_right(starts[thread], t_ns) - 1
            if pos >= 0:
                start_ns, end_ns, candidate = ranges[thread][pos]
                if start_ns <= t_ns <= end_ns:
                    index = candidate
        if index is not None:
            per_op_us[index] = per_op_us.get(index, 0.0) + dur_us
        kernels.append(
            KernelRecord(
                name=e.name(),
                device_us=dur_us,
                op_index=index,
                start_us=(e.start_ns() - first_ns) / 1000.0,
            )
        )
    return per_op_us, kernels


def summed_kernel_us(prof: profile) -> float:
    """Total device time of every kernel (and copy) a profiled region ran, in microseconds."""
    return sum(
        (e.end_ns() - e.start_ns()) / 1000.0
        for e in prof.profiler.kineto_results.events()
        if e.device_type() != DeviceType.CPU and not _is_annotation(e)
    )


def _is_annotation(event: Any) -> bool:
    if event.name().startswith(_PREFIX):
        return True
    is_annotation = getattr(event, "is_user_annotation", None)
    return bool(is_annotation()) if is_annotation is not None else False
