"""The step summary as plain data: totals, figures by phase, top modules and source lines.

Pure functions of a :class:`levers.capture.records.Capture` (or its op and call records); the
terminal renderer and tests read what they return. Nothing here prints.

Keys that an op can be ranked by (:data:`KEYS`):
    "flops": FLOPs from PyTorch's FLOP registry,
    "bytes": bytes moved, read plus written,
    "device_us": GPU kernel time joined to the op (absent on a CPU),
    "wall_us": host time in the op,
    "ops": one per op (a count).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from levers.capture.records import PHASES, CallRecord, Capture, OpRecord

KEYS = ("flops", "bytes", "device_us", "wall_us", "ops")

OUTSIDE_MODEL = "<outside model>"
MODEL_ROOT = "<model>"
UNKNOWN_SOURCE = "<unknown source>"


@dataclass(frozen=True)
class Totals:
    """Sums over every op of the captured step."""

    num_ops: int
    flops: int
    read_bytes: int
    write_bytes: int
    wall_us: float
    device_us: float | None  # None when no op carries device time (a CPU run)

    @property
    def moved_bytes(self) -> int:
        return self.read_bytes + self.write_bytes


@dataclass(frozen=True)
class Row:
    """One line of a top-N table: a module or source line and its share of a key's total."""

    label: str  # module path, OUTSIDE_MODEL, MODEL_ROOT, "file:line" or UNKNOWN_SOURCE
    value: float  # the key's sum over the row's ops
    share: float  # value / total over all ops, in [0, 1]
    num_ops: int
    code: str = ""  # for a source line: the text of that line


@dataclass(frozen=True)
class TimingSummary:
    """Wall time of the plain timed steps and of the captured step."""

    median_s: float
    min_s: float
    max_s: float
    num_steps: int  # plain timed steps; 0 when only the captured step was timed
    captured_s: float
    overhead_ratio: float | None  # captured / median of plain steps; None without plain steps
    tokens_per_step: int | None
    tokens_per_s: float | None


@dataclass(frozen=True)
class SyncSite:
    """A source line that made the host wait for the device, and how often in the step."""

    label: str  # "file:line" or UNKNOWN_SOURCE
    code: str
    names: tuple[str, ...]  # the calls seen there ("Tensor.__bool__", "item", ...), sorted
    count: int
    num_in_torch: int = 0  # of count, made by torch's own code called from here (an optimizer)


@dataclass(frozen=True)
class CallSummary:
    """The high-level call records, counted."""

    counts: dict[str, int]  # kind -> number of calls, most frequent first
    sdpa_backends: dict[str, int]  # backend that ran -> number of SDPA calls
    sync_sites: tuple[SyncSite, ...]  # most frequent first


def op_value(op: OpRecord, key: str) -> float:
    """The amount of ``key`` (one of :data:`KEYS`) that ``op`` contributes."""
    if key == "flops":
        return op.flops
    if key == "bytes":
        return op.read_bytes + op.write_bytes
    if key == "device_us":
        return op.device_us or 0.0
    if key == "wall_us":
        return op.wall_us
    if key == "ops":
        return 1
    raise ValueError(f"unknown key {key!r}; use one of {', '.join(KEYS)}")


def totals(ops: Sequence[OpRecord]) -> Totals:
    has_device = any(op.device_us is not None for op in ops)
    return Totals(
        num_ops=len(ops),
        flops=sum(op.flops for op in ops),
        read_bytes=sum(op.read_bytes for op in ops),
        write_bytes=sum(op.write_bytes for op in ops),
        wall_us=sum(op.wall_us for op in ops),
        device_us=sum(op.device_us or 0.0 for op in ops) if has_device else None,
    )


def has_device_time(ops: Sequence[OpRecord]) -> bool:
    return any(op.device_us is not None for op in ops)


def by_phase(ops: Iterable[OpRecord], key: str) -> dict[str, float]:
    """``key`` summed per phase: every phase of PHASES in order (0 when absent), then any other."""
    sums: dict[str, float] = {phase: 0 for phase in PHASES}
    for op in ops:
        sums[op.phase] = sums.get(op.phase, 0) + op_value(op, key)
    return sums


def module_label(module: str | None) -> str:
    if module is None:
        return OUTSIDE_MODEL
    return module or MODEL_ROOT


def top_modules(ops: Sequence[OpRecord], key: str, n: int) -> list[Row]:
    """The ``n`` innermost modules with the most ``key``; an op counts for its own module only."""
    return _top(ops, key, n, lambda op: (module_label(op.module), ""))


def top_sources(ops: Sequence[OpRecord], key: str, n: int) -> list[Row]:
    """The ``n`` user source lines with the most ``key``, each with the code on that line."""

    def group(op: OpRecord) -> tuple[str, str]:
        if op.source is None:
            return UNKNOWN_SOURCE, ""
        return str(op.source), op.source.code

    return _top(ops, key, n, group)


def _top(ops: Sequence[OpRecord], key: str, n: int, group) -> list[Row]:
    values: dict[str, float] = {}
    counts: Counter[str] = Counter()
    codes: dict[str, str] = {}
    for op in ops:
        label, code = group(op)
        values[label] = values.get(label, 0) + op_value(op, key)
        counts[label] += 1
        codes.setdefault(label, code)
    total = sum(values.values())
    ranked = sorted(
        ((label, v) for label, v in values.items() if v > 0), key=lambda item: (-item[1], item[0])
    )
    return [
        Row(label, value, value / total, counts[label], codes[label]) for label, value in ranked[:n]
    ]


def timing_summary(capture: Capture) -> TimingSummary:
    steps = capture.timing.step_s
    captured = capture.timing.captured_step_s
    median = capture.timing.median_s
    tokens = capture.tokens_per_step
    return TimingSummary(
        median_s=median,
        min_s=min(steps) if steps else captured,
        max_s=max(steps) if steps else captured,
        num_steps=len(steps),
        captured_s=captured,
        overhead_ratio=captured / median if steps and median > 0 else None,
        tokens_per_step=tokens,
        tokens_per_s=tokens / median if tokens and median > 0 else None,
    )


def call_summary(calls: Sequence[CallRecord]) -> CallSummary:
    counts = Counter(call.kind for call in calls)
    backends = Counter(
        str(call.args.get("backend_ran") or "unknown") for call in calls if call.kind == "sdpa"
    )
    return CallSummary(
        counts=dict(_most_common(counts)),
        sdpa_backends=dict(_most_common(backends)),
        sync_sites=_sync_sites(call for call in calls if call.kind == "sync"),
    )


def _sync_sites(calls: Iterable[CallRecord]) -> tuple[SyncSite, ...]:
    counts: Counter[str] = Counter()
    in_torch: Counter[str] = Counter()
    names: dict[str, set[str]] = {}
    codes: dict[str, str] = {}
    for call in calls:
        label = str(call.source) if call.source is not None else UNKNOWN_SOURCE
        counts[label] += 1
        in_torch[label] += bool(call.args.get("caller_in_torch"))
        names.setdefault(label, set()).add(call.name)
        codes.setdefault(label, call.source.code if call.source is not None else "")
    return tuple(
        SyncSite(label, codes[label], tuple(sorted(names[label])), count, in_torch[label])
        for label, count in _most_common(counts)
    )


def _most_common(counter: Counter[str]) -> list[tuple[str, int]]:
    """Highest count first, ties by name, so output is stable."""
    return sorted(counter.items(), key=lambda item: (-item[1], item[0]))
