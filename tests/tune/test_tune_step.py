"""Step.tune: candidates from the real catalogue on a real workload, a fake or a real A/B, the
record, the printed lines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fakes import FakeAb

import levers
from levers.tune.result import TuneResult

def _events(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_step_tune_keeps_what_pays_and_writes_the_record(tmp_path):
    record = tmp_path / "tune.record.jsonl"
    fake = FakeAb({"inplace-scatter": 1.3, "loss-valid-rows": 0.8})
    result = levers.Step("demo", params={"size": "tiny"}).tune(
        budget="10m", measure=fake, clock=fake.clock, record=record, audit=False
    )
    assert isinstance(result, TuneResult)
    assert result.stack == ("inplace-scatter",)
    assert result.apply_line == 'handle = levers.apply(model, "inplace-scatter", optimizer=opt)'
    assert result.ab_command == "levers ab demo --set size=tiny --lever inplace-scatter --steps 20"
    outcomes = {o.lever: o for o in result.outcomes}
    assert outcomes["loss-valid-rows"].reason.startswith("slower")
    # the GPU-only levers are left out on a CPU, with why
    assert outcomes["compile-blocks"].reason.startswith("its speed-up exists only on a GPU")
    events = _events(record)
    assert [e["event"] for e in events] == ["tune-trial"] * len(fake.calls) + ["tune-result"]
    assert events[-1]["stack"] == ["inplace-scatter"]
    assert events[-1]["proof"]["pays"] is True
    assert events[-1]["environment"]["torch"]


def test_the_record_is_appended_to_never_rewritten(tmp_path):
    record = tmp_path / "tune.record.jsonl"
    for _ in range(2):
        fake = FakeAb({})
        levers.Step("demo", params={"size": "tiny"}).tune(
            measure=fake, clock=fake.clock, record=record, audit=False, levers="inplace-scatter"
        )
    assert [e["event"] for e in _events(record)] == ["tune-trial", "tune-result"] * 2


def test_nothing_pays_is_an_answer(tmp_path):
    fake = FakeAb({})
    result = levers.Step("demo", params={"size": "tiny"}).tune(
        measure=fake, clock=fake.clock, audit=False
    )
    assert result.nothing_pays and result.apply_line is None and result.ab_command is None
    assert all(not o.kept and o.reason for o in result.outcomes)


def test_bad_input_is_refused_before_any_work():
    step = levers.Step("demo", params={"size": "tiny"})
    with pytest.raises(ValueError, match="write the budget as 10m"):
        step.tune(budget="soon")
    with pytest.raises(ValueError, match="unknown lever 'nope'"):
        step.tune(levers="nope")
    with pytest.raises(ValueError, match="num_steps must be at least 2"):
        step.tune(steps=1)


def test_tune_needs_a_spec():
    step = levers.Step(levers.Step("demo", params={"size": "tiny"}).workload())
    with pytest.raises(TypeError, match="from the workload spec"):
        step.tune(measure=FakeAb({}))


def test_end_to_end_on_the_demo_with_ab(tmp_path):
    """Real A/Bs (ab's runner) on the tiny demo: a few seconds."""
    record = tmp_path / "r.jsonl"
    result = levers.Step("demo", params={"size": "tiny"}).tune(
        budget="2m", levers="inplace-scatter", steps=4, warmup=1, parity_steps=2,
        resamples=200, record=record, audit=False,
    )
    trials = result.search.trials
    assert trials, "inplace-scatter applies to the demo on a CPU and was measured"
    assert all(t.ab is not None or t.error for t in trials)
    if result.stack:
        assert result.proof.base == () and result.proof.tokens_per_s_ci95[0] > 1.0
    kinds = [e["event"] for e in _events(record)]
    assert kinds == ["tune-trial"] * len(trials) + ["tune-result"]


def test_the_audit_that_orders_the_candidates_measures_nothing_itself(monkeypatch):
    seen = {}
    real = levers.Step.audit

    def audit(self, **kwargs):
        seen.update(kwargs)
        return real(self, **kwargs)

    monkeypatch.setattr(levers.Step, "audit", audit)
    fake = FakeAb({})
    levers.Step("demo", params={"size": "tiny"}).tune(
        measure=fake, clock=fake.clock, levers="inplace-scatter"
    )
    assert seen["measure"] is False
