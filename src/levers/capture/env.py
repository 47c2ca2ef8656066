"""The global settings a capture ran under (the flags that decide which kernels run); where it
ran is :func:`levers.environment.environment`."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import torch

from levers.batches import batches_of
from levers.capture.distributed import distributed_info


def plain_tensors(value: torch.Tensor) -> Iterator[torch.Tensor]:
    """The plain tensors holding ``value``'s data: itself, or the tensors a wrapper subclass is
    made of (``__tensor_flatten__``: torchao's 8-bit optimizer state, float8 tensors, DTensor),
    which has no storage of its own and an ``element_size`` of the dtype it poses as."""
    flatten = getattr(value, "__tensor_flatten__", None)
    if type(value) is not torch.Tensor and callable(flatten):
        names, _ = flatten()
        for name in names:
            yield from plain_tensors(getattr(value, name))
    else:
        yield value


def tensor_nbytes(value: torch.Tensor) -> int:
    """The bytes a tensor holds, a wrapper subclass counted by the tensors it is made of."""
    return sum(t.numel() * t.element_size() for t in plain_tensors(value))


def _moments(optimizer: torch.optim.Optimizer) -> tuple[dict[str, int], list[int]]:
    """The optimizer's per-parameter state tensors that are not scalars (Adam's moments; the
    step counters are scalars): their bytes by form (the dtype of a plain tensor, the class name
    of a tensor subclass such as torchao's ``OptimState8bit``), and the value counts of the plain
    float32 ones (what MEM004 prices the optimizer-state levers on)."""
    by_form: dict[str, int] = {}
    float32_numels: list[int] = []
    for state in optimizer.state.values():
        for value in state.values():
            if not isinstance(value, torch.Tensor) or value.dim() == 0:
                continue
            plain = type(value) is torch.Tensor or isinstance(value, torch.nn.Parameter)
            form = str(value.dtype).removeprefix("torch.") if plain else type(value).__name__
            by_form[form] = by_form.get(form, 0) + tensor_nbytes(value)
            if form == "float32":
                float32_numels.append(value.numel())
    return by_form, float32_numels


def _optimizer_info(optimizer: torch.optim.Optimizer | None) -> dict[str, Any] | None:
    if optimizer is None:
        return None
    plain = (bool, int, float, str, type(None))
    defaults = {k: v for k, v in optimizer.defaults.items() if isinstance(v, plain)}
    moment_bytes, float32_moment_numels = _moments(optimizer)
    return {
        "class": type(optimizer).__name__,
        "defaults": defaults,
        "num_params": sum(len(g["params"]) for g in optimizer.param_groups),
        # what ZeRO-1/FSDP would shard across ranks
        "state_bytes": sum(
            tensor_nbytes(v)
            for state in optimizer.state.values()
            for v in state.values()
            if isinstance(v, torch.Tensor)
        ),
        # the state by form, and the float32 moments' sizes (what MEM004 reads)
        "moment_bytes": moment_bytes,
        "float32_moment_numels": float32_moment_numels,
    }


def settings(workload: Any, recorder: Any) -> dict[str, Any]:
    """Global settings that decide which kernels run; read after the step."""
    return {
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "cuda_matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "cuda_alloc_conf": os.environ.get(
            "PYTORCH_CUDA_ALLOC_CONF", os.environ.get("PYTORCH_ALLOC_CONF")
        ),
        "autocast": sorted(recorder.autocast_seen),
        "activation_checkpointing": recorder.num_recomputed > 0,
        "optimizer": _optimizer_info(workload.optimizer),
        "distributed": distributed_info(workload.model),
        "batches": _batches_layout(workload),
    }


def _batches_layout(workload: Any) -> str | None:
    """The layout of the batches the step draws through ``step.batches`` ("padded", or the data
    lever that changed it), or None when the step exposes none (the data levers need them)."""
    found = batches_of(getattr(workload, "step", None))
    return None if found is None else found.layout
