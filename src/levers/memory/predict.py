"""``predict_memory``: the peak GPU memory of a workload's training step, predicted on any
machine (no GPU needed), attributed, and checked against a GPU's capacity.
"""

from __future__ import annotations

from dataclasses import replace
from collections.abc import Callable
from typing import Any

from levers.hardware import GpuSpec, resolve_gpu
from levers.memory import attribution
from levers.memory.fake import DEFAULT_NUM_STEPS
from levers.memory.plan import MemoryPlan
from levers.memory.prediction import Prediction, Source, assumptions_of, run_prediction, source_of
from levers.memory.whatif import all_whatifs
from levers.workload import Workload

DEFAULT_MARGIN = 0.05


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
    transform: Callable[[Workload], None] | None = None,
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
        whatifs: also predict the what-ifs (activation checkpointing, bf16 and 8-bit optimizer
            states, loss over valid rows, SDPA), each a full or partial re-prediction.
        transform: changes the built workload before its first step, in this prediction and
            every what-if's (the levers of ``levers memory --lever``; a compiled module is
            predicted compiled: :mod:`levers.memory.compiled`).

    Returns:
        A :class:`MemoryPlan` with the predicted ``max_memory_allocated`` and
        ``max_memory_reserved``, their attribution and the moment of the peak.
    """
    spec = resolve_gpu(gpu)
    margin = check_margin(margin)
    source = source_of(workload_or_factory, params, transform)
    return predict_source(source, spec, margin, num_steps=num_steps, whatifs=whatifs)


def predict_source(
    source: Source, gpu: GpuSpec, margin: float, *, num_steps: int, whatifs: bool
) -> MemoryPlan:
    """The plan of ``source`` on ``gpu``: one prediction, and the what-ifs when asked."""
    prediction = run_prediction(source, gpu, num_steps=num_steps)
    plan = plan_from(prediction, gpu, margin)
    if whatifs:
        plan = replace(plan, whatifs=all_whatifs(source, gpu, prediction, num_steps=num_steps))
    return plan
