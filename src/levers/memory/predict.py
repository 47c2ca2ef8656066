"""``predict_memory``: the peak GPU memory of a workload's training step, predicted on any
machine (no GPU needed), attributed, and checked against a GPU's capacity.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from levers.memory import attribution
from levers.memory.fake import DEFAULT_NUM_STEPS, trace_workload, with_gpu_device
from levers.hardware import GpuSpec, resolve_gpu
from levers.memory.plan import MemoryPlan
from levers.memory.replay import Replay, replay
from levers.memory.trace import Trace
from levers.workload import Workload

DEFAULT_MARGIN = 0.05


@dataclass(frozen=True)
class Source:
    """How to build a workload again (under fake tensors, with other parameters)."""

    build: Callable[[dict[str, Any]], Workload]  # params -> Workload
    params: dict[str, Any]
    label: str

    def with_params(self, **changes: Any) -> Source:
        return Source(self.build, {**self.params, **changes}, self.label)


def source_of(workload_or_factory: Any, params: dict[str, Any] | None = None) -> Source:
    """A :class:`Source` for a spec (``"llama"``, ``"file.py:factory"``) or a factory."""
    params = dict(params or {})
    if isinstance(workload_or_factory, Workload):
        raise TypeError(
            "predict_memory needs to build the workload itself, under fake tensors: pass its "
            "factory (or a spec such as 'llama') and the parameters, not a built Workload"
        )
    if isinstance(workload_or_factory, str):
        from levers.loader import load_workload

        spec = workload_or_factory
        factory = _factory_of(spec)
        if factory is not None:
            params = with_gpu_device(factory, params)
        else:
            params.setdefault("device", "cuda")
        return Source(lambda p: load_workload(spec, p), params, spec)
    if callable(workload_or_factory):
        factory = workload_or_factory
        label = getattr(factory, "__name__", "workload")
        return Source(lambda p: _call_factory(factory, p), with_gpu_device(factory, params), label)
    raise TypeError(
        f"predict_memory takes a workload spec or factory, got {type(workload_or_factory).__name__}"
    )


def _factory_of(spec: str) -> Callable[..., Any] | None:
    """The factory a spec names (resolving it also reports a bad spec early), if the loader
    can say; its signature tells whether it takes a device."""
    try:
        from levers.loader import _resolve
    except ImportError:  # a loader without the helper: assume the factory takes a device
        return None
    return _resolve(spec)[0]


def _call_factory(factory: Callable[..., Any], params: dict[str, Any]) -> Workload:
    workload = factory(**params)
    if not isinstance(workload, Workload):
        raise TypeError(
            f"the factory returned {type(workload).__name__}, not a levers.Workload; return "
            "Workload(model=..., step=...)"
        )
    return workload


@dataclass(frozen=True)
class Prediction:
    """A trace and its replay: the raw material of a plan, what-ifs and fits."""

    trace: Trace
    replay: Replay
    workload_name: str
    params: dict[str, Any]
    seconds: float


def run_prediction(
    source: Source,
    gpu: GpuSpec,
    *,
    num_steps: int = DEFAULT_NUM_STEPS,
    transform: Callable[[Workload], None] | None = None,
) -> Prediction:
    start = time.perf_counter()
    trace, workload = trace_workload(
        lambda: source.build(source.params), gpu, num_steps=num_steps, transform=transform
    )
    replayed = replay(trace)
    return Prediction(
        trace=trace,
        replay=replayed,
        workload_name=workload.name,
        params=dict(workload.params or source.params),
        seconds=time.perf_counter() - start,
    )


def assumptions_of(prediction: Prediction) -> tuple[str, ...]:
    notes = list(prediction.trace.assumptions)
    config = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    if config:
        notes.append(
            f"PYTORCH_CUDA_ALLOC_CONF={config!r} is set here; the allocator model assumes the "
            "default settings"
        )
    return tuple(notes)


def plan_from(prediction: Prediction, gpu: GpuSpec, margin: float) -> MemoryPlan:
    trace, replayed = prediction.trace, prediction.replay
    budget = gpu.usable_bytes * (1.0 - margin)
    return MemoryPlan(
        workload=prediction.workload_name,
        params=prediction.params,
        gpu=gpu,
        num_steps=trace.num_steps,
        peak_allocated_bytes=replayed.peak_allocated_bytes,
        peak_reserved_bytes=replayed.peak_reserved_bytes,
        usable_bytes=gpu.usable_bytes,
        margin=margin,
        fits=replayed.peak_reserved_bytes <= budget,
        num_parameters=trace.num_parameters,
        by_category=attribution.by_category(trace, replayed),
        activations_by_module=attribution.activations_by_module(trace, replayed),
        peak=attribution.peak_moment(trace, replayed),
        live_at_peak=attribution.live_at_peak(trace, replayed),
        timeline=attribution.timeline(trace, replayed),
        around_peak=attribution.around_peak(trace, replayed),
        attention=attribution.attention(trace),
        assumptions=assumptions_of(prediction),
        seconds=prediction.seconds,
    )


def check_margin(margin: float) -> float:
    if not 0.0 <= margin < 1.0:
        raise ValueError(f"margin must be in [0, 1), got {margin!r}; e.g. 0.05 keeps 5% free")
    return float(margin)


def predict_memory(
    workload_or_factory: Any,
    gpu: str | GpuSpec = "h100-80gb",
    *,
    params: dict[str, Any] | None = None,
    margin: float = DEFAULT_MARGIN,
    num_steps: int = DEFAULT_NUM_STEPS,
    whatifs: bool = False,
) -> MemoryPlan:
    """Predict the peak GPU memory of a training step without a GPU.

    Args:
        workload_or_factory: a workload spec (``"llama"``, ``"path/file.py:factory"``,
            ``"pkg.mod:factory"``) or a factory function returning a :class:`levers.Workload`.
        gpu: a GPU name (``h100-80gb``, ``h200``, ``a100-80gb``, ``a100-40gb``), a budget such
            as ``"40GiB"``, or a :class:`GpuSpec`.
        params: keyword arguments for the factory (``device`` defaults to ``"cuda"``).
        margin: the fraction of usable memory to keep free when judging whether it fits.
        num_steps: training steps to run after the build; peaks are over the whole run.
        whatifs: also predict the what-ifs (activation checkpointing, bf16 optimizer states,
            loss over valid rows), each a full or partial re-prediction.

    Returns:
        A :class:`MemoryPlan` with the predicted ``max_memory_allocated`` and
        ``max_memory_reserved``, their attribution and the moment of the peak.
    """
    spec = resolve_gpu(gpu)
    margin = check_margin(margin)
    source = source_of(workload_or_factory, params)
    prediction = run_prediction(source, spec, num_steps=num_steps)
    plan = plan_from(prediction, spec, margin)
    if whatifs:
        from dataclasses import replace

        from levers.memory.whatif import all_whatifs

        plan = replace(plan, whatifs=all_whatifs(source, spec, prediction, num_steps=num_steps))
    return plan
