"""Kill lines stop a run with a clear reason and keep what was measured."""

from __future__ import annotations

import signal
import time

import pytest
from ab_helpers import side

from levers.ab.killlines import KillLines
from levers.ab.runner import AbConfig, run_ab
from levers.ab.steps import _deadline
from levers.ab.verdict import DAMAGED, KILLED, NOT_MEASURED

FAST = dict(num_steps=10, num_warmup=2, num_parity_steps=3, num_resamples=500)


def test_nan_loss_in_the_timed_steps_stops_the_run_and_keeps_the_samples(clock):
    # 3 parity + 2 warm-up steps, so the candidate's 9th step is its 4th timed step
    result = run_ab(side(clock=clock), side(clock=clock, nan_at=9), AbConfig(**FAST))
    kill = result.killed
    assert (kill.kind, kill.phase, kill.side, kill.step) == (
        "nonfinite_loss",
        "timed",
        "candidate",
        4,
    )
    assert kill.reason == "candidate loss is nan at timed step 4; the run is stopped"
    assert len(result.samples["baseline"].dur_ms) == 4
    assert len(result.samples["candidate"].dur_ms) == 4
    assert result.read("step_time").ci is not None  # 4 complete pairs still give a CI
    assert result.decision == KILLED


def test_nan_loss_in_the_parity_steps_is_killed_and_fails_parity(clock):
    result = run_ab(side(clock=clock), side(clock=clock, nan_at=2), AbConfig(**FAST))
    assert (result.killed.kind, result.killed.phase, result.killed.step) == (
        "nonfinite_loss",
        "parity",
        2,
    )
    assert result.samples is None
    assert result.read("step_time").verdict == NOT_MEASURED
    assert result.read("parity").verdict == DAMAGED  # the NaN step compared as a failure
    assert result.decision == DAMAGED
    assert result.parity.candidate_losses[1] != result.parity.candidate_losses[1]  # NaN


def test_nan_loss_in_the_baseline_is_killed_too(clock):
    result = run_ab(side(clock=clock, nan_at=6), side(clock=clock), AbConfig(**FAST))
    assert (result.killed.side, result.killed.phase, result.killed.step) == ("baseline", "timed", 1)


def test_the_time_budget_stops_the_run(clock):
    # every step takes 1 s on the fake clock: 3 float64 reference steps, 6 parity steps, 4 warm-up
    # steps, then timed steps
    result = run_ab(
        side(clock=clock, step_ms=1000.0),
        side(clock=clock, step_ms=1000.0),
        AbConfig(**FAST, time_budget_s=17.5),
    )
    kill = result.killed
    assert (kill.kind, kill.phase, kill.side, kill.step) == ("time_budget", "timed", "candidate", 3)
    assert "time budget of 17.5 s spent" in kill.reason
    # ab's advice names ab's own option, apart from the reason: levers tune, which sets the
    # line itself, quotes the reason alone and says what to do in its own words
    assert kill.advice == "raise --time-budget-s or lower --steps"
    assert "--time-budget-s" not in kill.reason and kill.message.endswith(kill.advice)
    assert len(result.samples["baseline"].dur_ms) == 3
    assert len(result.samples["candidate"].dur_ms) == 2
    # only complete pairs enter the ratio
    assert result.read("step_time").ci.ratio == pytest.approx(1.0)


def test_a_step_that_raises_is_recorded_as_a_kill(clock):
    result = run_ab(side(clock=clock), side(clock=clock, raise_at=5), AbConfig(**FAST))
    kill = result.killed
    assert (kill.kind, kill.phase, kill.side, kill.step) == ("step_error", "warmup", "candidate", 2)
    assert kill.reason == "candidate warmup step 2 raised RuntimeError: boom in the user's step"
    assert "ab_factories.py" in kill.user_traceback



def test_the_time_budget_stops_a_step_that_runs_past_it_inside_the_step(clock):
    # the candidate's first parity step (its 1st call) blocks for 60 s, as a first compile of a
    # big model does; on the fake clock no time passes between steps, so only the stop inside
    # that step can end the A/B: 2 s into it, not 58 s after the budget
    started = time.monotonic()
    result = run_ab(side(), side(stall_at=1, stall_s=60.0), AbConfig(**FAST, time_budget_s=2.0))
    assert time.monotonic() - started < 30.0
    kill = result.killed
    assert (kill.kind, kill.phase, kill.side, kill.step) == ("time_budget", "parity", "candidate", 1)
    assert "during candidate parity step 1, which was stopped there" in kill.reason
    assert result.decision == KILLED
    # nothing of the alarm is left behind
    assert signal.getsignal(signal.SIGALRM) == signal.SIG_DFL
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_a_users_own_alarm_handler_is_left_alone():
    # a step that handles SIGALRM itself: levers arms no stop of its own (the kill line is then
    # checked between steps only, as before)
    lines = KillLines(time_budget_s=5.0, started_s=time.perf_counter())
    previous = signal.signal(signal.SIGALRM, lambda *_: None)
    try:
        with _deadline(lines) as armed:
            assert not armed
            assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    finally:
        handler = signal.signal(signal.SIGALRM, previous)
    assert handler is not signal.SIG_DFL  # the user's, untouched
    with _deadline(lines) as armed:  # without one, the stop is armed for the time left
        assert armed and 0.0 < signal.getitimer(signal.ITIMER_REAL)[0] <= 5.0
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
