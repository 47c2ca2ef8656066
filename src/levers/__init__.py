"""levers: find, fix and prove the speed and memory levers of a PyTorch training step.

    import levers

    plan = levers.predict_memory("llama", gpu="h100-80gb", params={"size": "8b"})

    with levers.apply(model, "rms-norm-fused,fused-optimizer", optimizer=opt):
        ...  # the levers are undone when the block ends

``apply`` is :func:`levers.levers.handle.apply`. ``predict_memory`` and ``MemoryPlan`` are :mod:`levers.memory`'s, loaded on first use: the memory
model imports torch's fake-tensor machinery, which ``import levers`` should not pay for, and
:mod:`levers.memory` itself imports :mod:`levers.workload` through this package.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from levers.workload import Workload

if TYPE_CHECKING:
    from levers.levers.handle import apply
    from levers.memory import MemoryPlan, predict_memory

__version__ = "0.1.0"

# name -> the module that defines it, imported when the name is first read
_LAZY = {
    "predict_memory": "levers.memory",
    "MemoryPlan": "levers.memory",
    "apply": "levers.levers.handle",
}

__all__ = ["MemoryPlan", "Workload", "__version__", "apply", "predict_memory"]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'levers' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later reads skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
