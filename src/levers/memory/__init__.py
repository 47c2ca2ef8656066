"""Peak GPU memory of a training step, predicted without a GPU, attributed, and fitted.

``predict_memory(workload_or_factory, gpu=...)`` runs the workload's factory and steps on fake
tensors that stand in for the GPU, replays the allocations through a model of PyTorch's CUDA
caching allocator, and returns a :class:`MemoryPlan`. See ``docs/memory.md``.
"""

from typing import TYPE_CHECKING

from levers.lazy import lazy_attributes

if TYPE_CHECKING:
    from levers.hardware import GPUS
    from levers.hardware import GpuSpec
    from levers.hardware import resolve_gpu
    from levers.memory.plan import MemoryPlan
    from levers.memory.predict import DEFAULT_MARGIN
    from levers.memory.predict import predict_memory

# imported on first read (levers.lazy): `levers --help` imports this package without torch
__getattr__, __dir__ = lazy_attributes(
    __name__,
    globals(),
    {
        "GPUS": "levers.hardware",
        "GpuSpec": "levers.hardware",
        "resolve_gpu": "levers.hardware",
        "MemoryPlan": "levers.memory.plan",
        "DEFAULT_MARGIN": "levers.memory.predict",
        "predict_memory": "levers.memory.predict",
    },
)

__all__ = ["DEFAULT_MARGIN", "GPUS", "GpuSpec", "MemoryPlan", "predict_memory", "resolve_gpu"]
