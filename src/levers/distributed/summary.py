"""One rank's record for the merged report: its step, where the step's time went, its collectives.

Communication is the time of the c10d collective ops in the captured step (DDP's bucket
all-reduces, FSDP2's all-gathers and reduce-scatters, explicit ``dist.*`` calls), which the
capture records as ops like any other. On a GPU that is the device time joined to them; on a
CPU it is their host wall time, which for gloo is the time to enqueue the collective (gloo
moves the data on its own threads, and the wait shows up as idle time). ``timing_source`` says
which. Compute is every other op; idle is the median plain step's wall time that the ops' time
does not account for (waits, host overhead; 0 when the ops under capture took longer than a
plain step, as they can on a CPU).

The buckets are those of :func:`levers.capture.collectives.is_bucket`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from levers.capture.collectives import collective_name, is_bucket, is_collective, op_bytes
from levers.capture.records import Capture, OpRecord

HOST_TIME = "host wall time of the captured step (CPU)"
DEVICE_TIME = "device time of the captured step (GPU)"


def op_time_us(op: OpRecord, on_gpu: bool) -> float:
    return float(op.device_us or 0.0) if on_gpu else float(op.wall_us)


@dataclass(frozen=True)
class Collective:
    name: str  # "allreduce", "allgather", "reduce_scatter_tensor", ...
    count: int
    bytes: int
    time_us: float


@dataclass(frozen=True)
class Bucket:
    index: int  # order in the step
    bytes: int
    dtype: str
    time_us: float


@dataclass(frozen=True)
class RankSummary:
    """One rank's step, or the error it raised instead (``error`` set, figures empty)."""

    rank: int
    world_size: int
    error: str | None = None  # "ValueError: boom" when the rank raised
    workload: str = ""
    step_s: tuple[float, ...] = ()  # the timed plain steps
    median_step_s: float | None = None
    captured_step_s: float | None = None
    compute_us: float = 0.0
    comm_us: float = 0.0
    idle_us: float = 0.0
    timing_source: str = ""
    collectives: tuple[Collective, ...] = ()
    buckets: tuple[Bucket, ...] = ()
    distributed: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RankSummary":
        data = dict(data)
        data["step_s"] = tuple(data.get("step_s") or ())
        data["collectives"] = tuple(Collective(**c) for c in data.get("collectives") or ())
        data["buckets"] = tuple(Bucket(**b) for b in data.get("buckets") or ())
        return cls(**data)


def _collectives(ops: list[OpRecord], on_gpu: bool) -> tuple[Collective, ...]:
    by_name: dict[str, list[OpRecord]] = {}
    for op in ops:
        by_name.setdefault(collective_name(op), []).append(op)
    return tuple(
        Collective(
            name=name,
            count=len(group),
            bytes=sum(op_bytes(op) for op in group),
            time_us=sum(op_time_us(op, on_gpu) for op in group),
        )
        for name, group in sorted(by_name.items())
    )


def summarize(capture: Capture, rank: int, world_size: int) -> RankSummary:
    """The record of a rank whose step was captured."""
    on_gpu = capture.memory.source == "cuda-allocator"
    comm_ops = [op for op in capture.ops if is_collective(op)]
    comm_us = sum(op_time_us(op, on_gpu) for op in comm_ops)
    total_us = sum(op_time_us(op, on_gpu) for op in capture.ops)
    step_us = capture.timing.median_s * 1e6
    buckets = tuple(
        Bucket(index=i, bytes=op_bytes(op), dtype=op.inputs[0].dtype, time_us=op_time_us(op, on_gpu))
        for i, op in enumerate(op for op in comm_ops if is_bucket(op))
    )
    return RankSummary(
        rank=rank,
        world_size=world_size,
        workload=capture.workload,
        step_s=tuple(capture.timing.step_s),
        median_step_s=capture.timing.median_s,
        captured_step_s=capture.timing.captured_step_s,
        compute_us=total_us - comm_us,
        comm_us=comm_us,
        idle_us=max(step_us - total_us, 0.0),
        timing_source=DEVICE_TIME if on_gpu else HOST_TIME,
        collectives=_collectives(comm_ops, on_gpu),
        buckets=buckets,
        distributed=dict(capture.settings.get("distributed") or {}),
    )


def error_text(exc: BaseException) -> str:
    """``ValueError: boom`` for the exception the user's code raised (not levers' wrapper)."""
    cause = exc.__cause__ if exc.__cause__ is not None else exc
    return f"{type(cause).__name__}: {cause}"


def failed(rank: int, world_size: int, exc: BaseException) -> RankSummary:
    """The record of a rank whose load or step raised."""
    return RankSummary(rank=rank, world_size=world_size, error=error_text(exc))
