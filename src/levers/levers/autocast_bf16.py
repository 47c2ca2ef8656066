"""``autocast-bf16``: run the training step under ``torch.autocast`` in bfloat16.

The step is wrapped (forward, loss, backward and optimizer step run inside the autocast region;
autocast only changes the ops it lists, so backward and the optimizer are unaffected). The
parameters stay in their dtype; matmuls and convolutions run in bf16 on the tensor cores.

Fix safety: changes numerics (bf16 matmuls). Tolerance checked: 5e-2 relative on the loss and
on the gradient norm after one step, against fp32.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch

from levers.levers import register
from levers.levers.lever import Lever, Target
from levers.vocab import CHANGES_NUMERICS

MARK = "_levers_autocast_bf16"


def _device_type(model: torch.nn.Module) -> str:
    first = next(model.parameters(), None)
    return first.device.type if first is not None else "cpu"


def applies(target: Target) -> str | None:
    if target.step is None:
        return "it wraps the training step: pass the step (levers.apply(model, ..., step=fn))"
    if getattr(target.step, MARK, False):
        return "the step already runs under bf16 autocast (applied before)"
    dtypes = {p.dtype for p in target.model.parameters()}
    if dtypes and all(d in (torch.bfloat16, torch.float16) for d in dtypes):
        return "the parameters are already 16-bit; autocast would change nothing"
    return None


def patch(target: Target) -> Callable[[], None]:
    original = target.step
    device_type = _device_type(target.model)

    @functools.wraps(original)
    def step() -> Any:
        with torch.autocast(device_type, dtype=torch.bfloat16):
            return original()

    setattr(step, MARK, True)
    target.step = step

    def undo() -> None:
        target.step = original

    return undo


LEVER = register(
    Lever(
        id="autocast-bf16",
        title="Run the step under torch.autocast(dtype=torch.bfloat16)",
        safety=CHANGES_NUMERICS,
        tolerance=5e-2,
        fixes=("DTYPE001",),
        applies=applies,
        patch=patch,
        needs_gpu=True,
        known_problems="the built-in workloads already autocast on a GPU: there it changes nothing",
    )
)
