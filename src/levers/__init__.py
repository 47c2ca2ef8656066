"""levers: find, fix and prove the speed and memory levers of a PyTorch training step.

    import levers

    step = levers.Step("demo")             # one step: captured once, handed to every analysis
    audited = step.audit(target="h100")    # ranked findings; step.memory(gpu=...), step.ab(levers)

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

from levers._version import __version__

if TYPE_CHECKING:
    from levers.workload import Workload
    from levers.api import Step
    from levers.runs.guards import MetricBar, RunGuard, RunKilled
    from levers.runs.resume import misplaced_step_tensors, rehome_step_tensors
    from levers.levers.handle import apply
    from levers.memory import MemoryPlan, predict_memory

# name -> the module that defines it, imported when the name is first read
_LAZY = {
    # the workload record names torch's types, so it is loaded on first use too: `levers --help`
    # and `levers list` must not pay for importing torch
    "Workload": "levers.workload",
    # the front object over the analyses (capture, audit, memory, ab)
    "Step": "levers.api",
    "predict_memory": "levers.memory",
    "MemoryPlan": "levers.memory",
    # run guards (docs/guards.md)
    "RunGuard": "levers.runs.guards",
    "RunKilled": "levers.runs.guards",
    "MetricBar": "levers.runs.guards",
    "rehome_step_tensors": "levers.runs.resume",
    # capture a step from inside a training loop (docs: README, zero-code and in-loop capture)
    "capture_step": "levers.integrations.inline",
    "misplaced_step_tensors": "levers.runs.resume",
    # apply levers to a model or workload, with undo (docs/levers.md)
    "apply": "levers.levers.handle",
}

__all__ = [
    "MemoryPlan",
    "MetricBar",
    "RunGuard",
    "RunKilled",
    "Step",
    "Workload",
    "apply",
    "capture_step",
    "__version__",
    "misplaced_step_tensors",
    "predict_memory",
    "rehome_step_tensors",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'levers' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later reads skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
