"""``inplace-scatter``: scatter into a fresh activation instead of into a clone of it.

A clone whose only purpose is an in-place scatter doubles that tensor's memory and traffic;
autograd accepts the write into a fresh non-leaf that nothing saved for backward. In user code
the fix is an edit (drop the ``.clone()`` on the line COPY001 names). The ``demo`` carries it as
its ``clone`` switch, which this lever turns on in the built model.

Fix safety: exact (the same values; a write that autograd cannot accept raises at backward,
which the parity check would catch).
"""

from __future__ import annotations

from typing import Callable

from levers.levers import register
from levers.levers._demo import has_switch, switch_on
from levers.levers.lever import Lever, Target
from levers.vocab import EXACT


def applies(target: Target) -> str | None:
    if has_switch(target.model, "clone"):
        return None
    return (
        "no recognised clone-then-scatter site: in your own code, drop the .clone() before the "
        "in-place scatter on the line COPY001 names (levers does not rewrite source)"
    )


def patch(target: Target) -> Callable[[], None]:
    return switch_on(target.model, "clone")


LEVER = register(
    Lever(
        id="inplace-scatter",
        title="Scatter into the fresh tensor in place instead of into a clone",
        safety=EXACT,
        fixes=("COPY001",),
        applies=applies,
        patch=patch,
    )
)
