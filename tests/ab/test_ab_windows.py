"""The timed steps of two sides alternating in windows of steps (run_timed's window_s)."""

from __future__ import annotations

import itertools

import torch

from levers.ab.killlines import KillLines
from levers.ab.timing import run_timed
from levers.workload import Workload


def _sides(order: list[str]) -> list[tuple[str, Workload]]:
    """Two CPU workloads whose steps write their side's name to ``order`` as they run."""
    def side(name: str) -> tuple[str, Workload]:
        model = torch.nn.Linear(2, 2)

        def step() -> float:
            order.append(name)
            return 1.0

        return name, Workload(model=model, step=step, name=name, device=torch.device("cpu"))

    return [side("baseline"), side("candidate")]


def _ticks(per_call: float):
    """A host clock that moves ``per_call`` seconds each time it is read."""
    counter = itertools.count()
    return lambda: next(counter) * per_call


def _runs(order: list[str]) -> list[tuple[str, int]]:
    return [(name, len(list(group))) for name, group in itertools.groupby(order)]


def test_step_by_step_without_a_window():
    order: list[str] = []
    samples, kill = run_timed(_sides(order), 5, KillLines())
    assert kill is None
    assert order == ["baseline", "candidate"] * 5
    assert [len(s.dur_ms) for s in samples.values()] == [5, 5]


def test_windows_take_the_first_sides_first_window_length():
    order: list[str] = []
    # each clock read moves 0.1 s: the baseline's first window passes 0.25 s after 3 steps
    samples, kill = run_timed(_sides(order), 10, KillLines(), window_s=0.25, clock=_ticks(0.1))
    assert kill is None
    assert _runs(order) == [("baseline", 3), ("candidate", 3)] * 3 + [
        ("baseline", 1), ("candidate", 1)]
    assert [len(s.dur_ms) for s in samples.values()] == [10, 10]


def test_a_window_longer_than_the_run_times_each_side_in_one_block():
    order: list[str] = []
    samples, _ = run_timed(_sides(order), 4, KillLines(), window_s=100.0, clock=_ticks(0.1))
    assert _runs(order) == [("baseline", 4), ("candidate", 4)]
    assert [len(s.dur_ms) for s in samples.values()] == [4, 4]


def test_looks_fall_at_the_end_of_the_window_that_reaches_them():
    order: list[str] = []
    seen: list[tuple[int, int]] = []

    def decided(durations):
        seen.append((len(durations["baseline"]), len(durations["candidate"])))
        return len(seen) == 2  # decided at the second look

    samples, _ = run_timed(_sides(order), 20, KillLines(), looks=(5, 10, 15),
                           decided=decided, window_s=0.35, clock=_ticks(0.1))
    # windows of 4 steps: the looks at 5 and 10 fall at the ends of the windows to 8 and 12
    assert seen == [(8, 8), (12, 12)]
    assert [len(s.dur_ms) for s in samples.values()] == [12, 12]
    assert _runs(order) == [("baseline", 4), ("candidate", 4)] * 3
