"""The raw material of a memory prediction: how to build the workload again (:class:`Source`)
and one traced and replayed run of it under fake tensors (:class:`Prediction`).

:func:`plan_from` turns a prediction into a plan (:mod:`levers.memory.predict` predicts the plan
of a source); :mod:`whatif` and :mod:`fit` re-predict a source with changes.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch._dynamo.config
import torch._inductor.config

from levers.hardware import GpuSpec
from levers.loader import load_workload, resolve_factory
from levers.memory import attribution
from levers.memory.fake import DEFAULT_NUM_STEPS, trace_workload, with_gpu_device
from levers.memory.fake_failures import torch_logs_captured
from levers.memory.plan import MemoryPlan
from levers.memory.replay import Replay, replay
from levers.memory.trace import Trace
from levers.workload import Workload

# levers the predicted step leaves out when a stack names them: Triton kernels cannot run on fake
# tensors (the fused loss has a stand-in for Liger's; liger-kernels' norms and activations have
# none), and raise-batch is the fit itself. The compile levers are predicted with levers memory's
# own backend, whatever backend they name (levers.memory.compiled)
NOT_PREDICTED = ("liger-kernels", "raise-batch")


@dataclass(frozen=True)
class Source:
    """How to build a workload again (under fake tensors, with other parameters)."""

    build: Callable[[dict[str, Any]], Workload]  # params -> Workload
    params: dict[str, Any]
    label: str
    # the factory takes no device: it is built and run under ``torch.device("cuda")``
    default_device: str | None = None
    # applied to every build before its first step (levers: ``levers memory --lever``), in
    # every prediction of the source (what-ifs and fits included) and in ``--measure``
    transform: Callable[[Workload], None] | None = None

    def with_params(self, **changes: Any) -> Source:
        return dataclasses.replace(self, params={**self.params, **changes})

    def built(self, params: dict[str, Any] | None = None) -> Workload:
        """The workload built with ``params`` (default: the source's), transformed."""
        workload = self.build(self.params if params is None else params)
        if self.transform is not None:
            self.transform(workload)
        return workload


def source_of(
    workload_or_factory: Any,
    params: dict[str, Any] | None = None,
    transform: Callable[[Workload], None] | None = None,
) -> Source:
    """A :class:`Source` for a spec (``"llama"``, ``"file.py:factory"``) or a factory;
    ``transform`` changes each build before its first step (see :class:`Source`)."""
    if transform is not None:
        return dataclasses.replace(source_of(workload_or_factory, params), transform=transform)
    params = dict(params or {})
    if isinstance(workload_or_factory, Workload):
        raise TypeError(
            "predict_memory needs to build the workload itself, under fake tensors: pass its "
            "factory (or a spec such as 'llama') and the parameters, not a built Workload"
        )
    if isinstance(workload_or_factory, str):
        spec = workload_or_factory
        factory = _factory_of(spec)
        if factory is not None:
            with_device = with_gpu_device(factory, params)
        else:
            with_device = {"device": "cuda", **params}
        return Source(
            lambda p: load_workload(spec, p), with_device, spec, _default_device(with_device)
        )
    if callable(workload_or_factory):
        factory = workload_or_factory
        label = getattr(factory, "__name__", "workload")
        with_device = with_gpu_device(factory, params)
        return Source(
            lambda p: _call_factory(factory, p), with_device, label, _default_device(with_device)
        )
    raise TypeError(
        f"predict_memory takes a workload spec or factory, got {type(workload_or_factory).__name__}"
    )


def _default_device(params: dict[str, Any]) -> str | None:
    # a factory that cannot be told the device puts its tensors wherever torch's default device
    # says; on a GPU run that is what `with torch.device("cuda"):` around the script does
    return None if "device" in params else "cuda"


def _factory_of(spec: str) -> Callable[..., Any] | None:
    """The factory a spec names (resolving it also reports a bad spec early); its signature
    tells whether it takes a device."""
    return resolve_factory(spec)


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
    transforms = [t for t in (source.transform, transform) if t is not None]

    def transformed(workload: Workload) -> None:
        for change in transforms:
            change(workload)

    # torch logs each meta kernel that fails on the fakes; those lines are about this fake run
    with torch_logs_captured(), compile_settings_kept():
        trace, workload = trace_workload(
            lambda: source.build(source.params),
            gpu,
            num_steps=num_steps,
            transform=transformed if transforms else None,
            default_device=source.default_device,
        )
    replayed = replay(trace)
    return Prediction(
        trace=trace,
        replay=replayed,
        workload_name=workload.name,
        params=dict(workload.params or source.params),
        seconds=time.perf_counter() - start,
    )


@contextmanager
def compile_settings_kept() -> Iterator[None]:
    """dynamo's and inductor's process-wide settings put back as they were: a prediction's
    transform applies levers to a workload of fake tensors and drops it without their undo, and
    what they set for the process (compile-blocks unspecialises integer attributes and raises the
    recompile limit) must not stay in the process that asked for the prediction."""
    modules = (torch._dynamo.config, torch._inductor.config)
    saved = [module.get_config_copy() for module in modules]
    try:
        yield
    finally:
        for module, before in zip(modules, saved):
            now = module.get_config_copy()
            for key, value in before.items():
                if key in now and now[key] is not value and now[key] != value:
                    setattr(module, key, value)


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
    """The plan of one prediction on ``gpu``: its peaks, what fills them, and whether the
    reserved peak fits the usable memory less ``margin``."""
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
