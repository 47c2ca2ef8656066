"""Helpers for the ab tests: the factory file, and sides built from it through the loader."""

from __future__ import annotations

from pathlib import Path

from levers.ab.runner import Side
from levers.loader import load_workload

FACTORIES = Path(__file__).parent / "ab_factories.py"
SPEC = f"{FACTORIES}:build"


def side(**params) -> Side:
    """A side built through the loader from ab_factories.build(**params)."""
    return Side(lambda: load_workload(SPEC, params), SPEC, params)
