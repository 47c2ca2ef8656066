"""A failed parity gate runs the baseline again: a step that does not repeat itself from one seed
reads NOT_MEASURED, not DAMAGED; a wrong lever on a repeatable step still reads DAMAGED.

The arch sweep met it on reformer: its reversible layers reseed from the OS, and every lever, a
metric that changes nothing included, read DAMAGED there.
"""

from __future__ import annotations

import sys
from dataclasses import replace

import pytest
from ab_helpers import FACTORIES, side

from levers.ab.killlines import KillLines
from levers.ab.repeat import check_repeatable
from levers.ab.runner import AbConfig, run_ab
from levers.ab.verdict import DAMAGED, NOT_MEASURED, PARITY, decision

CONFIG = AbConfig(num_steps=4, num_warmup=1, num_parity_steps=2, num_resamples=200)
TIMED = ("step_time", "tokens_per_s")


def _parity(result):
    read = result.read("parity")
    assert result.parity.repeat in read.note  # what the check found is in the report
    return read.verdict, result.parity.repeat


def test_an_unrepeatable_step_is_not_measured_even_for_a_change_of_nothing():
    config = AbConfig(**{**CONFIG.__dict__, "exactness": "exact"})
    result = run_ab(side(unseeded=True), side(unseeded=True), config)
    verdict, notes = _parity(result)
    assert result.parity.passed is None and verdict == NOT_MEASURED
    assert "not repeatable" in notes and "manual_seed" in notes
    # nothing but the timed reads is DAMAGED (two identical sides may time apart on a loaded
    # machine: the timing is not what this test is about)
    untimed = {r.name: r.verdict for r in result.reads if r.name not in TIMED}
    assert DAMAGED not in untimed.values() and decision(untimed) != DAMAGED


def test_a_failed_gate_against_the_float64_run_is_checked_for_repeatability_too():
    # against the float64 run an unrepeatable candidate fails only where its noise happens to
    # exceed 3x the baseline's: the check is called on such a failure directly
    unseeded = side(unseeded=True)
    passed = run_ab(unseeded, side(unseeded=True), CONFIG).parity
    failed = replace(passed, passed=False, notes=())
    checked, kill = check_repeatable(unseeded.build, failed, seed=0, lines=KillLines())
    assert kill is None
    assert checked.passed is None and "not repeatable" in checked.repeat
    assert checked.tolerance.exactness == "changes-numerics"


def test_a_wrong_fix_on_a_repeatable_step_stays_damaged_and_says_the_baseline_repeated():
    result = run_ab(side(), side(fixed="no_residual"), CONFIG)
    verdict, notes = _parity(result)
    assert verdict == DAMAGED and result.decision == DAMAGED
    assert "the baseline repeated itself" in notes


@pytest.fixture
def leak_undone():
    yield
    for module in list(sys.modules.values()):  # the loader's copy of the factory file
        if getattr(module, "__file__", None) == str(FACTORIES):
            module.LEAKED_SCALE[0] = 1.0


def test_a_fix_that_leaks_into_models_built_after_it_stays_damaged_and_is_named(leak_undone):
    result = run_ab(side(), side(fixed="leaky"), CONFIG)
    verdict, notes = _parity(result)
    assert verdict == DAMAGED
    assert "something global was patched" in notes


def test_a_gate_that_passes_builds_nothing_more():
    builds = []

    def counted(**params):
        base = side(**params)
        return type(base)(lambda: builds.append(1) or base.build(), base.spec, base.params)

    result = run_ab(counted(), counted(fixed="rewrite"), CONFIG)
    assert _parity(result)[0] == PARITY
    assert len(builds) == 3  # the float64 run and the two sides


def test_a_second_run_that_stops_leaves_the_verdict_and_ctrl_c_there_is_handed_back():
    failed = run_ab(side(), side(fixed="no_residual"), CONFIG).parity
    raising = side(raise_at=1)
    checked, kill = check_repeatable(raising.build, failed, seed=0, lines=KillLines())
    assert checked.passed is False and kill is None
    assert "not checked" in checked.repeat and "boom in the user's step" in checked.repeat
    interrupted = side(interrupt_at=1)
    checked, kill = check_repeatable(interrupted.build, failed, seed=0, lines=KillLines())
    assert checked.passed is False and kill is not None and kill.kind == "interrupted"
