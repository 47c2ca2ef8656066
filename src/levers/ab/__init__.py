"""``levers ab``: pre-registered, parity-gated A/B comparisons of training steps.

The programmatic entry point is :func:`run_ab` with two :class:`Side`\\ s and an
:class:`AbConfig`; the command line lives in ``levers.cli.ab``. See ``docs/ab.md``.
"""

from levers.ab.runner import AbConfig, AbResult, Side, run_ab

__all__ = ["AbConfig", "AbResult", "Side", "run_ab"]
