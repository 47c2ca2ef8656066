"""Peak GPU memory of a training step, predicted without a GPU, attributed, and fitted.

``predict_memory(workload_or_factory, gpu=...)`` runs the workload's factory and steps on fake
tensors that stand in for the GPU, replays the allocations through a model of PyTorch's CUDA
caching allocator, and returns a :class:`MemoryPlan`. See ``docs/memory.md``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from levers.hardware import GPUS, GpuSpec, resolve_gpu

if TYPE_CHECKING:
    from levers.memory.plan import MemoryPlan
    from levers.memory.predict import DEFAULT_MARGIN, predict_memory

# loaded on first use: the model imports torch, which `levers memory --help` should not pay for
_LAZY = {"MemoryPlan": "levers.memory.plan", "DEFAULT_MARGIN": "levers.memory.predict",
         "predict_memory": "levers.memory.predict"}

__all__ = ["DEFAULT_MARGIN", "GPUS", "GpuSpec", "MemoryPlan", "predict_memory", "resolve_gpu"]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'levers.memory' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
