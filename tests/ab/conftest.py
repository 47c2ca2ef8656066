"""A fake clock for the ab tests."""

from __future__ import annotations

from types import SimpleNamespace

import pytest


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
