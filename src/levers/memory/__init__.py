"""Peak GPU memory of a training step, predicted without a GPU, attributed, and fitted.

``predict_memory(workload_or_factory, gpu=...)`` runs the workload's factory and steps on fake
tensors that stand in for the GPU, replays the allocations through a model of PyTorch's CUDA
caching allocator, and returns a :class:`MemoryPlan`. See ``docs/memory.md``.
"""

from levers.hardware import GPUS, GpuSpec, resolve_gpu
from levers.memory.plan import MemoryPlan
from levers.memory.predict import DEFAULT_MARGIN, predict_memory

__all__ = ["DEFAULT_MARGIN", "GPUS", "GpuSpec", "MemoryPlan", "predict_memory", "resolve_gpu"]
