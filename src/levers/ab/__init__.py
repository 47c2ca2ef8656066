"""``levers ab``: pre-registered, parity-gated A/B comparisons of training steps.

The programmatic entry point is :func:`run_ab` with two :class:`Side`\\ s and an
:class:`AbConfig`; the command line lives in ``levers.cli.ab``. See ``docs/ab.md``.
"""

from typing import TYPE_CHECKING

from levers.lazy import lazy_attributes

if TYPE_CHECKING:
    from levers.ab.runner import AbConfig
    from levers.ab.runner import AbResult
    from levers.ab.runner import Side
    from levers.ab.runner import run_ab

# imported on first read (levers.lazy): `levers --help` imports this package without torch
__getattr__, __dir__ = lazy_attributes(
    __name__,
    globals(),
    {
        "AbConfig": "levers.ab.runner",
        "AbResult": "levers.ab.runner",
        "Side": "levers.ab.runner",
        "run_ab": "levers.ab.runner",
    },
)

__all__ = ["AbConfig", "AbResult", "Side", "run_ab"]
