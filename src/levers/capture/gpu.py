"""GPU kernels joined to the ops that launched them, through PyTorch's profiler.

Each recorded op runs inside a profiler range named ``levers#<index>``; the profiler attaches
every kernel to the CPU op that launched it, so the kernels under a range are that op's kernels
and their summed duration is the op's device time.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
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


def _kernels_under(event: Any) -> list[Any]:
    found = list(getattr(event, "kernels", ()))
    for child in getattr(event, "cpu_children", ()):
        found.extend(_kernels_under(child))
    return found


def join_kernels(prof: profile) -> tuple[dict[int, float], list[KernelRecord]]:
    """(device microseconds per op index, every kernel with the op it belongs to)."""
    per_op_us: dict[int, float] = {}
    kernels: list[KernelRecord] = []
    joined: set[int] = set()
    events = prof.events()
    for event in events:
        if not event.name.startswith(_PREFIX):
            continue
        index = int(event.name[len(_PREFIX):])
        for kernel in _kernels_under(event):
            joined.add(id(kernel))
            per_op_us[index] = per_op_us.get(index, 0.0) + float(kernel.duration)
            kernels.append(KernelRecord(name=kernel.name, device_us=float(kernel.duration), op_index=index))
    # kernels launched outside any recorded op (the autograd engine's own work, collectives)
    for event in events:
        if event.name.startswith(_PREFIX) or event.cpu_parent is not None:
            continue
        for kernel in _kernels_under(event):
            if id(kernel) not in joined:
                joined.add(id(kernel))
                kernels.append(KernelRecord(name=kernel.name, device_us=float(kernel.duration), op_index=None))
    return per_op_us, kernels
