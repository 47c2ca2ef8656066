"""The Capture: plain, serializable records of one training step.

Everything downstream of the capture (detectors, the memory model, reports) reads these records
and nothing else. They are frozen dataclasses of plain values so that a Capture round-trips
through JSON (see ``docs/capture-schema.md``; bump ``SCHEMA_VERSION`` on any breaking change).

Legend for fields:
    phase: "forward" (anything before the first backward that is not the optimizer),
        "backward" (run by the autograd engine), "optimizer" (inside ``optimizer.step`` or
        ``optimizer.zero_grad``), "other" (after backward, outside the optimizer).
    module: the module path from ``model.named_modules()`` ("" is the model itself, e.g.
        "text.layers.3.attn"), or None for ops outside the model (a loss in the step function).
    source: "path/to/file.py:LINE" of the innermost frame outside torch and levers.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields
from typing import Any

SCHEMA_VERSION = 1

PHASES = ("forward", "backward", "optimizer", "other")


@dataclass(frozen=True)
class TensorMeta:
    """Shape, dtype and device of one tensor argument or result."""

    shape: tuple[int, ...]
    dtype: str  # "bfloat16", "float32", ...
    device: str  # "cpu", "cuda:0", "meta"

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True)
class SourceLoc:
    """Where in the user's code an op or call came from."""

    file: str  # path as Python reports it
    line: int
    function: str
    code: str  # the stripped text of that line ("" when unavailable)

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass(frozen=True)
class OpRecord:
    """One aten op that ran during the captured step."""

    index: int  # position in the step, from 0
    name: str  # "aten.mm.default"
    phase: str  # one of PHASES
    module: str | None
    source: SourceLoc | None
    inputs: tuple[TensorMeta, ...]  # tensor arguments, flattened, in argument order
    outputs: tuple[TensorMeta, ...]
    read_bytes: int  # bytes of tensor inputs read (0 for views and metadata-only ops)
    write_bytes: int  # bytes of tensor outputs written (0 for views)
    flops: int  # from torch.utils.flop_counter's registry; 0 where it has no formula
    wall_us: float  # host time spent in the op (CPU: the kernel itself; GPU: the launch)
    device_us: float | None = None  # GPU kernel time joined to this op; None on CPU
    live_bytes: int | None = None  # tensor bytes live right after the op
    forward_op: int | None = None  # backward: index of the forward op whose grad_fn ran this
    autograd_node: str | None = None  # backward: the autograd node name ("MmBackward0")
    recompute: bool = False  # ran inside activation-checkpoint recomputation
    is_view: bool = False  # aliases its input; moves no data
    is_inplace: bool = False  # mutates an input
    start_us: float | None = None  # host time from the capture's start to the op's start


def frozen_record(cls: type, values: dict[str, Any]) -> Any:
    """``cls(**values)`` for a frozen dataclass ``cls`` without the generated ``__init__``'s
    ``object.__setattr__`` per field (microseconds a record: a capture builds one OpRecord per
    op). ``values`` must name every field, and nothing else: nothing checks it here (a test
    does, for the one caller)."""
    record = object.__new__(cls)
    record.__dict__.update(values)
    return record


@dataclass(frozen=True)
class CallRecord:
    """A high-level call that diagnosis needs, with its arguments.

    kind is one of:
        "sdpa": torch.nn.functional.scaled_dot_product_attention; args hold q/k/v metas,
            attn_mask (meta or None), is_causal, dropout_p, scale, enable_gqa, and
            "backends_enabled" (the SDPA backends enabled at the call, after any
            ``sdpa_kernel`` pin), "backend_ran" (inferred from the aten op it dispatched to).
        "loss": cross_entropy / nll_loss / log_softmax / binary_cross_entropy_with_logits...;
            args hold input/target metas, ignore_index, reduction, label_smoothing and
            "ignored_fraction" (fraction of targets equal to ignore_index).
        "sync": a call that makes the host wait for the device (item, bool/int/float of a
            tensor, tolist, cpu, nonzero, boolean-mask indexing, masked_select, unique, ...).
        "memory_metric": torch.cuda.max_memory_allocated / max_memory_reserved /
            reset_peak_memory_stats / memory_allocated / memory_reserved / memory_stats.
    """

    index: int
    kind: str
    name: str  # "scaled_dot_product_attention", "item", "Tensor.__bool__", ...
    phase: str
    module: str | None
    source: SourceLoc | None
    args: dict[str, Any]
    first_op: int | None  # index of the first aten op the call dispatched (None if none)
    last_op: int | None  # index of the last one (inclusive)


@dataclass(frozen=True)
class KernelRecord:
    """A GPU kernel that ran, joined to the op that launched it."""

    name: str
    device_us: float
    op_index: int | None  # the OpRecord that launched it; None if it could not be joined
    start_us: float | None = None  # device time from the step's first kernel to this one's start


@dataclass(frozen=True)
class StepTiming:
    """Wall time of plain (uncaptured) steps, and of the captured step."""

    step_s: tuple[float, ...]  # each timed plain step, synchronized
    # the captured step, capture overhead included: the timed pass of a two-pass capture (the
    # profiler alone), the step under the op recorder of a one-pass one
    captured_step_s: float

    @property
    def median_s(self) -> float:
        xs = sorted(self.step_s or (self.captured_step_s,))
        mid = len(xs) // 2
        return xs[mid] if len(xs) % 2 else 0.5 * (xs[mid - 1] + xs[mid])


@dataclass(frozen=True)
class MemoryStats:
    """Peak and end-of-step memory of the captured step.

    On a GPU these come from the CUDA caching allocator (``max_memory_allocated`` and
    ``max_memory_reserved`` over the captured step). On a CPU they are the tensor storages levers
    tracked itself: live at the start plus what ops allocate, minus what is freed.
    """

    source: str  # "cuda-allocator" or "tracked-storages"
    start_bytes: int
    peak_bytes: int
    end_bytes: int
    peak_reserved_bytes: int | None = None
    peak_op: int | None = None  # index of the op after which the tracked peak was reached


def peak_op(ops: Iterable[OpRecord]) -> int | None:
    """The index of the op after which the most bytes were live (None: no op has a figure)."""
    best, best_bytes = None, -1
    for op in ops:
        if op.live_bytes is not None and op.live_bytes > best_bytes:
            best, best_bytes = op.index, op.live_bytes
    return best


@dataclass(frozen=True)
class CapturePasses:
    """How the step was captured.

    "two-pass": the ops and calls come from a step run under the op recorder (the content
    pass, untimed), the timing, the kernels, their device time and (on a GPU) the allocator's
    bytes from the next step run under the profiler alone (the timed pass), joined to the
    content pass's ops by aligning the profiler's op events with them (name and input shapes,
    in order). "one-pass": one step recorded and timed under the op recorder; ``reason`` says
    why (asked for, an inline block, the alignment fell short, the run ended after one step).
    """

    mode: str  # "two-pass" or "one-pass"
    reason: str | None = None
    content_step_s: float | None = None  # wall time of the step under the op recorder
    num_timed_ops: int | None = None  # op events the profiler saw in the timed pass
    num_aligned_ops: int | None = None  # content ops aligned with a timed op event
    coverage: float | None = None  # num_aligned_ops over the content pass's ops
    num_kernels_to_neighbour: int = 0  # kernels of unaligned op events, given to an aligned op


@dataclass(frozen=True)
class Capture:
    """Everything levers recorded about one training step."""

    schema_version: int
    workload: str
    workload_params: dict[str, Any]
    tokens_per_step: int | None
    env: dict[str, Any]  # torch, python, platform, device, device_name, levers, git commit
    provenance: dict[str, str]  # figure -> "measured" | "counted" | "estimated" | "tracked"
    timing: StepTiming
    memory: MemoryStats
    ops: tuple[OpRecord, ...]
    calls: tuple[CallRecord, ...]
    kernels: tuple[KernelRecord, ...] = ()
    modules: dict[str, str] = field(default_factory=dict)  # module path -> class name
    settings: dict[str, Any] = field(default_factory=dict)  # autocast, TF32, allocator conf...
    passes: CapturePasses | None = None  # None in a capture written before levers said it

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Capture":
        if data.get("schema_version") != SCHEMA_VERSION:
            raise ValueError(
                f"capture schema version {data.get('schema_version')!r} is not supported by this "
                f"levers (expects {SCHEMA_VERSION}); re-capture the step with this version"
            )
        return _build(cls, data)


def _meta(d: dict[str, Any]) -> TensorMeta:
    return TensorMeta(shape=tuple(d["shape"]), dtype=d["dtype"], device=d["device"])


def _source(d: dict[str, Any] | None) -> SourceLoc | None:
    return None if d is None else SourceLoc(**d)


def _build(cls: type, data: dict[str, Any]) -> Any:
    """Rebuild nested records from their ``asdict`` form."""
    if cls is Capture:
        kwargs = {f.name: data[f.name] for f in fields(Capture) if f.name in data}
        kwargs["timing"] = StepTiming(
            step_s=tuple(data["timing"]["step_s"]),
            captured_step_s=data["timing"]["captured_step_s"],
        )
        kwargs["memory"] = MemoryStats(**data["memory"])
        kwargs["ops"] = tuple(_build(OpRecord, o) for o in data["ops"])
        kwargs["calls"] = tuple(_build(CallRecord, c) for c in data["calls"])
        kwargs["kernels"] = tuple(KernelRecord(**k) for k in data.get("kernels", ()))
        if data.get("passes") is not None:
            kwargs["passes"] = CapturePasses(**data["passes"])
        return Capture(**kwargs)
    if cls is OpRecord:
        d = dict(data)
        d["source"] = _source(d["source"])
        d["inputs"] = tuple(_meta(m) for m in d["inputs"])
        d["outputs"] = tuple(_meta(m) for m in d["outputs"])
        return OpRecord(**d)
    if cls is CallRecord:
        d = dict(data)
        d["source"] = _source(d["source"])
        return CallRecord(**d)
    raise AssertionError(f"no builder for {cls}")
