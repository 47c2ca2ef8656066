"""A failed float64-reference gate asked once more (levers.ab.rounding): the candidate's own
float64 run tells a change of the math (planted wrong levers stay DAMAGED) from the step's fp32
rounding amplified (a correct change turns to PARITY), only for levers whose change a float64
run keeps. No verdict here hangs on how a CPU rounds: the planted errors change the math by far
more than rounding, and the correct change's float64 run is exact to float64's rounding, some
five orders under its fp32 difference."""

from __future__ import annotations

from dataclasses import replace
from functools import partial

import pytest
from ab_planted import WRONG, build

import levers.ab.rounding as rounding
from levers.ab.killlines import KillLines
from levers.ab.parity import parity_gate
from levers.ab.reads import parity_read
from levers.ab.repeat import REPEATED, check_repeatable
from levers.ab.runner import Side, _float64_faithful


def failed_gate(lever: str):
    """The gate of ``lever`` against the baseline, asked whether the baseline repeats itself."""
    result = parity_gate(partial(build), partial(build, lever=lever), num_steps=3)
    if result.passed is False:
        result, _ = check_repeatable(partial(build), result, seed=0, lines=KillLines())
    return result


@pytest.mark.parametrize("lever", WRONG)
def test_a_planted_wrong_lever_stays_damaged_in_float64_too(lever):
    result = failed_gate(lever)
    assert result.passed is False and result.repeat.startswith(REPEATED)
    asked, kill = rounding.check_rounding(partial(build, lever=lever), result, faithful=True,
                                          seed=0, lines=KillLines())
    assert kill is None and asked.passed is False
    assert "in float64 too the candidate differs from the baseline" in asked.repeat
    assert parity_read(asked).verdict == "DAMAGED"


def _as_failed(result):
    """A passing gate's result with its last reference check read as failed, as a step that
    amplifies rounding past the allowance would leave it (the numbers are the gate's own)."""
    checks = list(result.checks)
    last = max(i for i, c in enumerate(checks) if c.gating and c.candidate_error)
    checks[last] = replace(checks[last], passed=False)
    return replace(result, passed=False, checks=tuple(checks),
                   repeat=f"{REPEATED} (a second run matched the first exactly): the difference "
                   "is the candidate's")


def test_a_correct_change_whose_gate_failed_reads_parity_once_run_in_float64():
    result = parity_gate(partial(build), partial(build, lever="reordered"), num_steps=3)
    assert result.passed is True
    asked, kill = rounding.check_rounding(partial(build, lever="reordered"), _as_failed(result),
                                          faithful=True, seed=0, lines=KillLines())
    assert kill is None and asked.passed is True
    assert "in float64 the candidate computes what the baseline computes" in asked.repeat
    assert parity_read(asked).verdict == "PARITY"


def test_nothing_more_is_run_for_a_lever_a_float64_run_would_not_keep(monkeypatch):
    result = _as_failed(parity_gate(partial(build), partial(build, lever="reordered"),
                                    num_steps=3))
    monkeypatch.setattr(rounding, "run_reference", lambda *a, **k: pytest.fail("ran"))
    asked, _ = rounding.check_rounding(partial(build, lever="reordered"), result,
                                       faithful=False, seed=0, lines=KillLines())
    assert asked is result
    # nor where the baseline did not repeat itself (the difference may be the step's own)
    unrepeated = replace(result, repeat="not repeatable: ...")
    assert rounding.check_rounding(partial(build), unrepeated, faithful=True, seed=0,
                                   lines=KillLines())[0] is unrepeated


def test_only_sides_that_differ_by_float64_faithful_levers_are_asked():
    def side(*levers, spec="arch", params=None):
        return Side(build=build, spec=spec, params=params or {"model": "resnet"}, levers=levers)

    assert _float64_faithful(side(), side("channels-last"))
    assert not _float64_faithful(side(), side("channels-last", "compile-model"))
    assert not _float64_faithful(side("compile-model"), side("compile-model", "channels-last"))
    assert not _float64_faithful(side(), side("autocast-bf16"))
    assert not _float64_faithful(side(), side())  # no lever: a candidate of its own making
    assert not _float64_faithful(side(), side("channels-last", params={"model": "convnext"}))
