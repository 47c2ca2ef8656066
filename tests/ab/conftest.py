"""Shared helpers for the ab tests: the factory file and a fake clock."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from levers.ab.runner import Side
from levers.loader import load_workload

FACTORIES = Path(__file__).parent / "ab_factories.py"
SPEC = f"{FACTORIES}:build"


def side(**params) -> Side:
    """A side built through the loader from ab_factories.build(**params)."""
    return Side(lambda: load_workload(SPEC, params), SPEC, params)


@pytest.fixture
def clock(monkeypatch):
    """A fake perf_counter that only moves when a test workload's step advances it."""
    import levers.ab.killlines
    import levers.ab.runner
    import levers.ab.timing

    now = [0.0]
    fake = SimpleNamespace(perf_counter=lambda: now[0])
    for module in (levers.ab.timing, levers.ab.killlines, levers.ab.runner):
        monkeypatch.setattr(module, "time", fake)
    return now
