"""Run guards on CPU: each kill line fires on a planted fault and stays quiet on a clean run."""

from __future__ import annotations

import math

import pytest
import torch

import levers
from levers.runs.guards import GuardKill, MetricBar, RunGuard, RunKilled
from levers.ab.killlines import GIB
from levers.ab.record import read_record
from levers.errors import LeversError


class PlantedMemory:
    """A CUDA-like allocator peak: reset() sets the peak to what is allocated now."""

    def __init__(self) -> None:
        self.allocated = 0
        self.peak = 0
        self.num_resets = 0

    def set(self, num_bytes: int) -> None:
        self.allocated = num_bytes
        self.peak = max(self.peak, num_bytes)

    def peak_bytes(self) -> int:
        return self.peak

    def reset(self) -> None:
        self.peak = self.allocated
        self.num_resets += 1


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def run_loop(guard, num_steps, *, loss=lambda s: 1.0, memory=None, mem=lambda s: 0, clock=None,
             dt=lambda s: 0.1, evals=None):
    """A plain training loop; returns the last step it completed."""
    last = None
    with guard:
        for step in range(1, num_steps + 1):
            if memory is not None:
                memory.set(mem(step))
            if clock is not None:
                clock.now += dt(step)
            guard.step(step, loss=loss(step))
            last = step
            if evals and step in evals:
                guard.eval(step, metrics=evals[step])
    return last


def test_a_clean_run_fires_nothing_and_logs_every_window(tmp_path):
    memory, clock = PlantedMemory(), Clock()
    guard = RunGuard(
        metric_bars=[MetricBar("probe", bar=2.0, num_evals=2, after_step=0)],
        mem_gate_gib=1.0,
        step_time_max_ratio=1.5,
        window_steps=10,
        record=tmp_path / "run.record.jsonl",
        memory_reader=memory,
        clock=clock,
    )
    last = run_loop(
        guard, 40, memory=memory, mem=lambda s: GIB // 2, clock=clock,
        evals={10: {"probe": 1.0}, 20: {"probe": 3.0}, 30: {"probe": 1.5}},
    )
    assert last == 40 and guard.killed is None
    assert [(w.first_step, w.last_step) for w in guard.windows] == [(1, 10), (11, 20), (21, 30), (31, 40)]
    events = [e["event"] for e in read_record(tmp_path / "run.record.jsonl")]
    assert events[0] == "guard_start" and events[-1] == "guard_end"
    assert events.count("window") == 4 and events.count("eval") == 3 and "kill" not in events


def test_nan_at_step_k_kills_at_k_and_checkpoints_first(tmp_path):
    saved = []
    guard = RunGuard(
        window_steps=10,
        record=tmp_path / "r.jsonl",
        checkpoint=lambda step, kill: saved.append((step, kill.line)),
    )
    last = run_loop(guard, 30, loss=lambda s: math.nan if s == 7 else 1.0)
    assert last == 6  # step 7 raised
    assert guard.killed == GuardKill(
        "nonfinite_loss", 7, "the loss is nan at step 7",
        {"loss": "nan", "first_bad_step": 7, "checked_at_step": 7},
    )
    assert saved == [(7, "nonfinite_loss")]
    events = read_record(tmp_path / "r.jsonl")
    kinds = [e["event"] for e in events]
    assert kinds[-3:] == ["kill", "checkpoint", "guard_end"]
    assert events[-3]["line"] == "nonfinite_loss" and events[-3]["step"] == 7


def test_inf_tensor_loss_checked_lazily_still_names_the_first_bad_step():
    guard = RunGuard(window_steps=10, nonfinite_check_every=5)
    losses = {3: math.inf, 4: math.nan}
    with pytest.raises(RunKilled) as caught:
        for step in range(1, 20):
            guard.step(step, loss=torch.tensor(losses.get(step, 1.0)))
    assert caught.value.kill.step == 3
    assert caught.value.kill.values["loss"] == "inf"
    assert guard._last_step == 5  # read at the 5th step, not before


def test_a_run_after_a_kill_is_refused():
    guard = RunGuard(window_steps=10)
    with pytest.raises(RunKilled):
        guard.step(1, loss=float("nan"))
    with pytest.raises(RunKilled):
        guard.step(2, loss=1.0)


def test_a_metric_ramp_fires_after_k_evals_in_a_row_past_step_s():
    bar = MetricBar("probe", bar=8.0, better="lower", num_evals=3, after_step=20)
    guard = RunGuard(metric_bars=[bar], window_steps=10)
    # worse from step 10 on; evals at or before step 20 do not count, so the 3rd counted is 50
    ramp = {s: {"probe": 6.0 + s / 10} for s in range(10, 100, 10)}
    last = run_loop(guard, 100, evals=ramp)
    kill = guard.killed
    assert kill.line == "metric_bar" and kill.step == 50 and last == 50
    assert [e["step"] for e in kill.values["evals"]] == [30, 40, 50]
    assert kill.values["evals"][0]["value"] == 9.0


def test_a_metric_that_recovers_resets_its_streak():
    bar = MetricBar("acc", bar=0.5, better="higher", num_evals=2)
    guard = RunGuard(metric_bars=[bar], window_steps=10)
    evals = {10: {"acc": 0.4}, 20: {"acc": 0.6}, 30: {"acc": 0.4}, 40: {"acc": 0.7}}
    assert run_loop(guard, 50, evals=evals) == 50 and guard.killed is None


def test_a_memory_ramp_trips_the_gate_on_the_windowed_peak():
    memory = PlantedMemory()
    guard = RunGuard(mem_gate_gib=2.0, window_steps=10, memory_reader=memory)
    # 0.05 GiB more per step: above 2 GiB from step 41; judged when the window 41-50 closes
    last = run_loop(guard, 100, memory=memory, mem=lambda s: int(s * 0.05 * GIB))
    kill = guard.killed
    assert kill.line == "memory_gate" and kill.step == 50 and last == 49
    assert kill.values["window_peak_bytes"] == int(50 * 0.05 * GIB)
    assert (kill.values["first_step"], kill.values["last_step"]) == (41, 50)


def test_the_windowed_peak_falls_back_after_a_spike_and_the_lifetime_peak_stays():
    memory = PlantedMemory()
    guard = RunGuard(window_steps=10, memory_reader=memory)
    spike = lambda s: 5 * GIB if s == 15 else 1 * GIB  # noqa: E731
    memory.set(3 * GIB)  # loading a checkpoint: the startup window
    run_loop(guard, 40, memory=memory, mem=spike)
    assert guard.startup_memory.window_peak_bytes == 3 * GIB
    peaks = [(w.memory.window_peak_bytes, w.memory.lifetime_peak_bytes) for w in guard.windows]
    assert peaks == [
        (1 * GIB, 3 * GIB),  # the load's transient counts for the lifetime, not for a window
        (5 * GIB, 5 * GIB),
        (1 * GIB, 5 * GIB),
        (1 * GIB, 5 * GIB),
    ]
    assert memory.num_resets == 5  # once at the start, once per window


def test_a_step_time_regression_against_the_first_window_fires():
    clock = Clock()
    guard = RunGuard(step_time_max_ratio=1.5, window_steps=10, clock=clock)
    last = run_loop(guard, 100, clock=clock, dt=lambda s: 0.1 if s <= 30 else 0.2)
    kill = guard.killed
    assert kill.line == "step_time_regression" and kill.step == 40 and last == 39
    assert kill.values["reference_median_step_s"] == pytest.approx(0.1)
    assert kill.values["ratio"] == pytest.approx(2.0)


def test_an_eval_inside_a_step_interval_is_not_a_regression():
    clock = Clock()
    guard = RunGuard(step_time_max_ratio=1.5, window_steps=10, clock=clock)
    evals = {s: {"x": 0.0} for s in range(12, 100, 2)}  # every other interval holds a slow eval

    def dt(step):
        return 5.0 if step - 1 in evals else 0.1

    assert run_loop(guard, 100, clock=clock, dt=dt, evals=evals) == 100
    assert guard.killed is None


def test_the_banner_gate_runs_before_step_one(tmp_path):
    guard = RunGuard(banner={"datasets": 880, "frames": 18_669_180}, record=tmp_path / "r.jsonl")
    with pytest.raises(LeversError, match="check_banner"):
        guard.step(1, loss=1.0)
    with pytest.raises(RunKilled) as caught:
        guard.check_banner({"datasets": 878, "frames": 18_669_180})
    assert caught.value.kill.line == "banner_gate" and caught.value.kill.step is None
    assert "datasets 878 (declared 880)" in caught.value.kill.reason
    ok = RunGuard(banner={"datasets": 880})
    assert ok.check_banner({"datasets": 880, "episodes": 3}).passed
    ok.step(1, loss=1.0)


def test_run_guard_is_exported_lazily():
    assert levers.RunGuard is RunGuard
    assert "RunGuard" in dir(levers)


def test_a_failing_checkpoint_hook_is_recorded_and_the_run_still_stops(tmp_path):
    def broken(step, kill):
        raise OSError("disk full")

    guard = RunGuard(window_steps=10, record=tmp_path / "r.jsonl", checkpoint=broken)
    with pytest.warns(UserWarning, match="disk full"):
        assert run_loop(guard, 10, loss=lambda s: math.inf if s == 2 else 1.0) == 1
    events = read_record(tmp_path / "r.jsonl")
    (checkpoint,) = [e for e in events if e["event"] == "checkpoint"]
    assert checkpoint["ok"] is False and "disk full" in checkpoint["error"]
    assert guard.killed.line == "nonfinite_loss"
