"""``float8-rowwise``: the ``float8`` lever with torchao's rowwise recipe, under an id of its own.

One power-of-two scale per row of each operand (CUTLASS's rowwise float8 GEMM) instead of one
per tensor: more accurate than tensorwise, with more casting work, and a stricter size filter
(see :mod:`levers.levers.float8`, which does the work). ``float8:recipe=rowwise`` is the same
lever; this id exists so that ``levers tune`` tries the two recipes as alternatives (one
exclusive group) and ``levers ab --lever float8-rowwise`` needs no option.

Fix safety: changes numerics, as ``float8``; the same tolerance was checked.
"""

from __future__ import annotations

from typing import Callable

from levers.levers import register
from levers.levers.float8 import convert, reason
from levers.levers.lever import Lever, Target
from levers.vocab import CHANGES_NUMERICS

RECIPE = "rowwise"


def applies(target: Target) -> str | None:
    return reason(target.model, RECIPE)


def patch(target: Target) -> Callable[[], None]:
    return convert(target.model, RECIPE)


LEVER = register(
    Lever(
        id="float8-rowwise",
        device_bound=True,
        title="Train the large linears in float8 with rowwise scales (torchao)",
        safety=CHANGES_NUMERICS,
        tolerance=1e-3,  # float8's (a literal: levers list reads it without importing)
        parity_floor=5e-2,  # float8's PARITY_FLOOR
        measured_on=("compile-blocks",),
        fixes=(),
        applies=applies,
        patch=patch,
        needs_gpu=True,
        runs_on_cpu=False,
        known_problems=(
            "float8:recipe=rowwise under its own id; was slower than tensorwise on a llama 1b at "
            "batch 4 on an H200 (more scaling work); pays only compiled"
        ),
    )
)
