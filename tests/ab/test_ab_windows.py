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
    samples, kill = run_timed(_sides(order), 16, KillLines(), window_s=0.25, clock=_ticks(0.1))
    assert kill is None
    assert _runs(order) == [("baseline", 3), ("candidate", 3)] * 5 + [
        ("baseline", 1), ("candidate", 1)]
    assert [len(s.dur_ms) for s in samples.values()] == [16, 16]


def test_a_window_that_the_last_steps_do_not_fill_is_cut_at_the_end():
    order: list[str] = []
    samples, _ = run_timed(_sides(order), 9, KillLines(), window_s=0.15, clock=_ticks(0.1))
    assert _runs(order) == [("baseline", 2), ("candidate", 2)] * 4 + [
        ("baseline", 1), ("candidate", 1)]
    assert [len(s.dur_ms) for s in samples.values()] == [9, 9]


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


def test_a_window_holds_at_most_a_quarter_of_the_steps():
    order: list[str] = []
    # the clock never passes the window: the cap of num_steps // 4 ends each window
    run_timed(_sides(order), 8, KillLines(), window_s=100.0, clock=_ticks(0.0))
    assert _runs(order) == [("baseline", 2), ("candidate", 2)] * 4


def test_cuda_alternates_in_windows_and_a_cpu_step_by_step():
    from levers.ab.runner import AbConfig
    from levers.ab.timing import WINDOW_S, window_for

    assert AbConfig().window_s == WINDOW_S > 0
    assert window_for("cuda", WINDOW_S) == WINDOW_S
    assert window_for(torch.device("cuda", 0), 1.5) == 1.5
    assert window_for("cpu", WINDOW_S) == 0.0


def test_ranks_of_a_distributed_run_alternate_step_by_step(monkeypatch):
    # each rank's window would be timed on its own clock and could end at another step than
    # the other ranks': their collectives would meet another side's
    from levers.ab.timing import WINDOW_S, window_for

    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda *a, **k: 2)
    assert window_for("cuda", WINDOW_S) == 0.0
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda *a, **k: 1)
    assert window_for("cuda", WINDOW_S) == WINDOW_S


def test_a_result_records_the_window_its_steps_ran_in():
    # a CPU run alternates step by step, and one at a time nothing alternates: both record 0,
    # and the design line says "alternating" or "one side at a time" without a window
    from ab_helpers import side

    from levers.ab.format import design_line
    from levers.ab.runner import AbConfig, run_ab

    for sides, order in (("together", "alternating;"), ("one-at-a-time", "one side at a time;")):
        result = run_ab(side(), side(), AbConfig(num_steps=4, num_warmup=1, num_parity_steps=1,
                                                 num_resamples=100, sides=sides))
        assert result.config.window_s == 0.0
        assert order in design_line(result)
