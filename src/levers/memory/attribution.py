"""What fills the peak: the live allocations at the allocated peak by category and by module,
the largest of them, the moment of the peak, and the curve around it.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict

from levers.memory.plan import (
    BackendCount,
    CategoryBytes,
    LiveTensor,
    ModuleBytes,
    PeakMoment,
    TimelinePoint,
)
from levers.memory.replay import Replay
from levers.memory.trace import CATEGORIES, Trace

OUTSIDE = "(outside modules)"
_BLOCK = re.compile(r"^(.*?\.\d+)(?:\.|$)")
NUM_LIVE = 12
NUM_TIMELINE = 240
NUM_AROUND = 12


def by_category(trace: Trace, replay: Replay) -> tuple[CategoryBytes, ...]:
    totals: Counter[str] = Counter()
    for handle, block_bytes in replay.live_at_peak:
        totals[trace.allocations[handle - 1].category] += block_bytes
    ordered = sorted(totals.items(), key=lambda item: (-item[1], CATEGORIES.index(item[0])))
    return tuple(CategoryBytes(category, nbytes) for category, nbytes in ordered)


def block_of(module: str | None) -> str:
    """The repeated block a module belongs to ("blocks.3.attn.qkv" -> "blocks.3")."""
    if module is None:
        return OUTSIDE
    match = _BLOCK.match(module)
    if match:
        return match.group(1)
    parts = module.split(".")
    return ".".join(parts[:2]) if parts != [""] else "(model)"


def activations_by_module(trace: Trace, replay: Replay) -> tuple[ModuleBytes, ...]:
    totals: dict[str, int] = defaultdict(int)
    for handle, block_bytes in replay.live_at_peak:
        allocation = trace.allocations[handle - 1]
        if allocation.category != "activations":
            continue
        key = block_of(allocation.module)
        if allocation.module is None and allocation.source:
            key = f"{OUTSIDE} {_short_source(allocation.source)}"
        totals[key] += block_bytes
    ordered = sorted(totals.items(), key=lambda item: -item[1])
    return tuple(ModuleBytes(module, nbytes) for module, nbytes in ordered)


def live_at_peak(trace: Trace, replay: Replay, limit: int = NUM_LIVE) -> tuple[LiveTensor, ...]:
    largest = sorted(replay.live_at_peak, key=lambda item: -item[1])[:limit]
    found = []
    for handle, block_bytes in largest:
        a = trace.allocations[handle - 1]
        found.append(
            LiveTensor(
                a.category,
                a.module,
                a.op,
                a.shape,
                a.dtype,
                block_bytes,
                a.phase,
                a.step,
                _short_source(a.source) if a.source else None,
            )
        )
    return tuple(found)


def peak_moment(trace: Trace, replay: Replay) -> PeakMoment:
    event = trace.events[replay.peak_event]
    a = trace.allocations[abs(event) - 1]
    return PeakMoment(
        a.phase,
        a.step,
        a.module,
        a.op,
        _short_source(a.source) if a.source else None,
        replay.peak_event,
    )


def _point(trace: Trace, replay: Replay, index: int) -> TimelinePoint:
    event = trace.events[index]
    a = trace.allocations[abs(event) - 1]
    return TimelinePoint(
        event_index=index,
        phase=a.phase if event > 0 else _phase_at(trace, index),
        step=a.step,
        allocated_bytes=replay.allocated_curve[index],
        reserved_bytes=replay.reserved_curve[index],
        op=a.op if event > 0 else "",
        module=a.module if event > 0 else None,
        delta_bytes=a.nbytes if event > 0 else -a.nbytes,
    )


def _phase_at(trace: Trace, index: int) -> str:
    # a free has no site of its own: take the phase of the nearest allocation before it
    for back in range(index, -1, -1):
        if trace.events[back] > 0:
            return trace.allocations[trace.events[back] - 1].phase
    return "build"


def timeline(trace: Trace, replay: Replay, points: int = NUM_TIMELINE) -> tuple[TimelinePoint, ...]:
    """About ``points`` samples of the curves, with every phase change and the peak kept."""
    count = len(replay.allocated_curve)
    if count == 0:
        return ()
    keep = set(range(0, count, max(count // points, 1)))
    keep.add(count - 1)
    keep.add(replay.peak_event)
    previous = None
    for index in range(count):
        event = trace.events[index]
        if event > 0:
            phase = trace.allocations[event - 1].phase
            if phase != previous:
                keep.add(index)
                previous = phase
    return tuple(_point(trace, replay, index) for index in sorted(keep))


def around_peak(trace: Trace, replay: Replay, count: int = NUM_AROUND) -> tuple[TimelinePoint, ...]:
    """The allocations just before the peak and the peak itself."""
    chosen = []
    index = replay.peak_event
    while index >= 0 and len(chosen) < count:
        if trace.events[index] > 0:
            chosen.append(index)
        index -= 1
    return tuple(_point(trace, replay, i) for i in reversed(chosen))


def attention(trace: Trace) -> tuple[BackendCount, ...]:
    per_step = max(trace.num_steps, 1)
    groups: dict[str, list] = defaultdict(list)
    for call in trace.sdpa_calls:
        groups[call.backend].append(call)
    found = []
    for backend, calls in sorted(groups.items(), key=lambda item: -len(item[1])):
        first = calls[0]
        example = (
            f"q {list(first.query_shape)} k {list(first.key_shape)} {first.dtype}"
            f"{' mask' if first.has_mask else ''}{' causal' if first.is_causal else ''}"
            f"{' gqa' if first.enable_gqa else ''}"
        )
        found.append(BackendCount(backend, len(calls) // per_step, example, first.rejected))
    return tuple(found)


def _short_source(source: str) -> str:
    path, _, line = source.rpartition(":")
    parts = path.replace("\\", "/").split("/")
    return f"{'/'.join(parts[-2:])}:{line}"
