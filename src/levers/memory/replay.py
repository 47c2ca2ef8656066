"""Replay an allocation trace through the caching-allocator model: the allocated and reserved
curves, their peaks, and what is live at the allocated peak.
"""

from __future__ import annotations

from dataclasses import dataclass

from levers.memory.allocator import CachingAllocator, OutOfMemory
from levers.memory.trace import Trace


@dataclass(frozen=True)
class Replay:
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    peak_event: int  # index into trace.events of the allocation that set the allocated peak
    live_at_peak: tuple[tuple[int, int], ...]  # (handle, block bytes) live right after it
    allocated_curve: tuple[int, ...]  # after each event
    reserved_curve: tuple[int, ...]
    oom_event: int | None = None  # first event the allocator could not serve within capacity


def replay(
    trace: Trace, capacity_bytes: int | None = None, sizes: dict[int, int] | None = None
) -> Replay:
    """Replay ``trace``; ``sizes`` overrides the bytes of some allocations (what-ifs)."""
    allocator = CachingAllocator(capacity_bytes)
    allocated: list[int] = []
    reserved: list[int] = []
    peak, peak_event, oom_event = -1, 0, None
    for index, event in enumerate(trace.events):
        handle = abs(event)
        if event > 0:
            nbytes = (
                trace.allocations[handle - 1].nbytes
                if sizes is None
                else sizes.get(handle, trace.allocations[handle - 1].nbytes)
            )
            try:
                allocator.malloc(handle, nbytes)
            except OutOfMemory:
                oom_event = index
                break
            if allocator.allocated_bytes > peak:
                peak, peak_event = allocator.allocated_bytes, index
        elif allocator.holds(handle):
            allocator.free(handle)
        allocated.append(allocator.allocated_bytes)
        reserved.append(allocator.reserved_bytes)
    live = _live_at(trace, peak_event, sizes)
    return Replay(
        peak_allocated_bytes=allocator.peak_allocated_bytes,
        peak_reserved_bytes=allocator.peak_reserved_bytes,
        peak_event=peak_event,
        live_at_peak=live,
        allocated_curve=tuple(allocated),
        reserved_curve=tuple(reserved),
        oom_event=oom_event,
    )


def _live_at(trace: Trace, stop: int, sizes: dict[int, int] | None) -> tuple[tuple[int, int], ...]:
    allocator = CachingAllocator()
    for event in trace.events[: stop + 1]:
        handle = abs(event)
        if event > 0:
            nbytes = trace.allocations[handle - 1].nbytes
            if sizes is not None:
                nbytes = sizes.get(handle, nbytes)
            allocator.malloc(handle, nbytes)
        elif allocator.holds(handle):
            allocator.free(handle)
    return tuple(allocator.live_blocks().items())
