"""``compile-blocks``: regional ``torch.compile`` of each repeated block of the model.

The repeated blocks (:func:`levers.blocks.repeated_blocks`: a decoder's layers, a ViT's blocks)
are compiled one by one with ``module.compile()``: every block of one class shares the compiled
code, so compile time is one block's, and a graph break elsewhere in the model (data-dependent
control flow, a host read) costs nothing inside the blocks. The undo drops the compiled call
(the module's parameters and state_dict never change).

Options: ``backend`` (default "inductor"), ``mode``, ``dynamic``, ``fullgraph``.

Fix safety: changes numerics (inductor fuses and reorders elementwise work). Tolerance checked:
1e-5 relative in fp32 (with the aot_eager backend on a CPU; inductor on a GPU).
"""

from __future__ import annotations

from typing import Callable

import torch

from levers.blocks import repeated_blocks
from levers.levers import register
from levers.levers.lever import Lever, Target
from levers.vocab import CHANGES_NUMERICS

OPTIONS = ("backend", "mode", "dynamic", "fullgraph")


def _liger_patched(model: torch.nn.Module) -> bool:
    if getattr(model, "_levers_liger_kernels", False):
        return True
    for module in model.modules():
        forward = vars(module).get("forward")
        if forward is not None and getattr(forward, "__module__", "").startswith("liger_kernel"):
            return True
        if type(module).__module__.startswith("liger_kernel"):
            return True
    return False


def applies(target: Target) -> str | None:
    blocks = repeated_blocks(target.model)
    if not blocks:
        return "no repeated blocks (a ModuleList or Sequential of two or more modules of one class)"
    if any(getattr(b.module, "_compiled_call_impl", None) is not None for b in blocks):
        return "the blocks are already compiled"
    if _liger_patched(target.model):
        return (
            "the model runs Liger Kernel's kernels: torch.compile over them fails in dynamo "
            "(torch 2.11); use compile-blocks or liger-kernels, not both"
        )
    return None


def patch(target: Target) -> Callable[[], None]:
    options = {k: v for k, v in target.options.items() if k in OPTIONS}
    blocks = [b.module for b in repeated_blocks(target.model)]
    for block in blocks:
        block.compile(**options)

    def undo() -> None:
        for block in blocks:
            block._compiled_call_impl = None

    return undo


LEVER = register(
    Lever(
        options=OPTIONS,
        id="compile-blocks",
        title="torch.compile each repeated block (regional compilation)",
        safety=CHANGES_NUMERICS,
        tolerance=1e-5,
        fixes=("NORM001", "ELEM001", "FUSE001", "FUSE002"),
        applies=applies,
        patch=patch,
        needs_gpu=True,
        known_problems=(
            "fails over Liger-patched modules (dynamo, torch 2.11); the first steps pay the "
            "compile time (one block's); a new input shape recompiles"
        ),
    )
)
