"""``levers tune -- python train.py`` without running a script: the A/B over runs of the script
(sides alternated, paired CI95, loss parity, the repeat check), the search around it, and what is
refused. The runs are fakes with the fields a run of ``levers.integrations.script_trial`` writes;
tests/tune/test_script_tune.py runs the real script."""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field

import pytest
from fakes import FakeAb
from rich.console import Console

from levers.ab.verdict import DAMAGED, NOT_MEASURED, PARITY
from levers.errors import LeversError, StepError
from levers.levers import load_all
from levers.tune.candidates import NEEDS_FACTORY
from levers.tune.measure import TrialDesign
from levers.tune.render import print_tune
from levers.tune.script import (
    NOT_REPEATABLE,
    ScriptDesign,
    SideRun,
    checked_baseline,
    script_measure,
    stack_tolerance,
    tune_script,
)
from levers.tune.trial import judge
from levers.vocab import EXACT

DESIGN = ScriptDesign(TrialDesign(steps=6, warmup=1, parity_steps=2, resamples=200), rounds=2)
LOSSES = (5.0, 4.5, 4.25, 4.0)  # script steps 3..6: 1 compile warm-up + 3 timed per run
WRAPS = "it wraps the training step (...)"


def _run(stack, step_s, losses=LOSSES, **data) -> SideRun:
    document = {"complete": True, "step_s": list(step_s), "losses": list(losses),
                "peak_allocated_bytes": None, "device": "cpu", "model": "TinyLM",
                "optimizer": "AdamW", "warmup": 2, "param_dtype": "float32", **data}
    return SideRun.from_document(tuple(stack), document)


@dataclass
class FakeScript:
    """Runs of a script: each lever makes its steps ``speed[lever]`` times faster; ``loss_shift``
    moves a lever's losses; ``noise`` moves every second baseline run's losses (an unseeded
    script)."""

    speed: dict[str, float] = field(default_factory=dict)
    loss_shift: dict[str, float] = field(default_factory=dict)
    noise: float = 0.0
    fail: dict[str, str] = field(default_factory=dict)
    probe_data: dict = field(default_factory=dict)
    calls: list[tuple[tuple[str, ...], bool]] = field(default_factory=list)

    def __call__(self, stack, timeout_s, *, probe=False, audit=False) -> SideRun:
        self.calls.append((tuple(stack), probe))
        for lever in stack:
            if lever in self.fail:
                return SideRun.from_document(tuple(stack), {
                    "complete": False, "error": self.fail[lever], "num_steps": 3})
        factor = 1.0
        shift = 0.0
        for lever in stack:
            factor *= self.speed.get(lever, 1.0)
            shift += self.loss_shift.get(lever, 0.0)
        runs_of_baseline = sum(1 for s, _ in self.calls if not s)
        if not stack and runs_of_baseline % 2 == 0:
            shift += self.noise
        # steps of slightly different lengths, as a real run has; the same in each run
        step_s = [0.10 / factor, 0.11 / factor, 0.09 / factor]
        extra = dict(self.probe_data) if probe else {}
        return _run(stack, step_s, [x * (1 + shift) for x in LOSSES], **extra)


def _registry_tolerance(levers):
    return stack_tolerance(levers, load_all(), False, None)


def test_the_sides_alternate_a_b_a_b_and_a_faster_stack_with_parity_pays():
    script = FakeScript(speed={"ac-full": 2.0})
    measure = script_measure(script, DESIGN, tolerance_of=_registry_tolerance)
    trial = measure((), ("ac-full",), None)
    assert [stack for stack, _ in script.calls] == [(), ("ac-full",), (), ("ac-full",)]
    assert trial.parity == PARITY
    assert "steps 3-4" in trial.parity_note
    assert trial.tokens_per_s_ratio == pytest.approx(2.0)
    low, high = trial.tokens_per_s_ci95
    assert 1.0 < low <= 2.0 <= high
    assert trial.step_time_ratio == pytest.approx(0.5)
    assert trial.step_ms == pytest.approx((100.0, 50.0))
    assert trial.peak_allocated_bytes is None and trial.peak_verdict == NOT_MEASURED
    assert trial.decision == "IMPROVED"
    assert judge(trial)[0] is True


def test_an_increment_runs_the_kept_stack_as_its_baseline():
    script = FakeScript(speed={"ac-full": 2.0, "rms-norm-fused": 1.5})
    measure = script_measure(script, DESIGN, tolerance_of=_registry_tolerance)
    trial = measure(("ac-full",), ("ac-full", "rms-norm-fused"), None)
    assert [stack for stack, _ in script.calls] == [("ac-full",), ("ac-full", "rms-norm-fused")] * 2
    assert trial.tokens_per_s_ratio == pytest.approx(1.5)


def test_a_loss_beyond_the_tolerance_is_damaged_and_does_not_pay():
    script = FakeScript(speed={"rms-norm-fused": 2.0}, loss_shift={"rms-norm-fused": 0.01})
    trial = script_measure(script, DESIGN, tolerance_of=_registry_tolerance)(
        (), ("rms-norm-fused",), None
    )
    assert trial.parity == DAMAGED
    assert "the loss of step 3 of the script differs by" in trial.parity_note
    assert trial.decision == DAMAGED
    pays, why = judge(trial)
    assert not pays and why.startswith("failed parity")


def test_parity_is_not_checked_when_the_baseline_does_not_repeat():
    script = FakeScript(speed={"ac-full": 2.0}, noise=0.01)
    trial = script_measure(script, DESIGN, tolerance_of=_registry_tolerance)(
        (), ("ac-full",), None
    )
    assert trial.parity == NOT_MEASURED
    assert trial.parity_note.startswith(NOT_REPEATABLE)
    assert "seed the script" in trial.parity_note
    pays, why = judge(trial)
    assert not pays and why.startswith("parity could not be checked")


def test_the_repeat_check_before_the_search_counts_for_the_baseline():
    script = FakeScript(speed={"ac-full": 2.0})
    measure = script_measure(script, DESIGN, tolerance_of=_registry_tolerance,
                             repeat=[0.5, 0.0, 0.0, 0.0])
    trial = measure((), ("ac-full",), None)
    assert trial.parity == NOT_MEASURED and NOT_REPEATABLE in trial.parity_note


def test_no_loss_seen_is_not_checked():
    script = FakeScript()
    no_loss = _run((), [0.1, 0.1, 0.1], losses=(None, None, None, None))

    def run_side(stack, timeout_s, **_):
        script(stack, timeout_s)
        return no_loss if not stack else _run(stack, [0.05] * 3, losses=(None,) * 4)

    trial = script_measure(run_side, DESIGN, tolerance_of=_registry_tolerance)(
        (), ("ac-full",), None
    )
    assert trial.parity == NOT_MEASURED
    assert "no scalar loss passed to backward() in step 3" in trial.parity_note


def test_a_stack_that_breaks_the_script_is_a_failed_trial_with_its_error():
    script = FakeScript(fail={"compile-blocks": "RuntimeError: dynamo failed"})
    trial = script_measure(script, DESIGN, tolerance_of=_registry_tolerance)(
        (), ("compile-blocks",), None
    )
    assert trial.decision == "FAILED"
    assert trial.error == "the stack failed in the script: RuntimeError: dynamo failed"
    assert len(script.calls) == 2  # the first candidate run failed: no second round


def test_a_run_past_the_time_left_stops_the_a_b():
    def timed_out(stack, timeout_s, **_):
        return SideRun(tuple(stack), complete=False, timed_out=True, error="too long")

    trial = script_measure(timed_out, DESIGN, tolerance_of=_registry_tolerance)(
        (), ("ac-full",), 5.0
    )
    assert trial.killed_kind == "time_budget" and trial.out_of_time
    assert "baseline side" in trial.killed


def test_the_tolerance_is_ab_s_for_the_declared_safety_or_the_lever_s_where_looser():
    registry = load_all()
    exact = stack_tolerance(("ac-full",), registry, False, None)
    assert exact.exactness == EXACT and exact.rtol_first == 1e-6
    numerics = stack_tolerance(("ac-full", "rms-norm-fused"), registry, False, None)
    assert numerics.exactness != EXACT and numerics.rtol_first == 1e-4
    assert stack_tolerance(("autocast-bf16",), registry, False, None).rtol_first == 0.05
    assert stack_tolerance(("ac-full",), registry, True, "bfloat16").rtol_last == 1e-2


def test_the_design_refuses_more_parity_steps_than_a_run_records():
    with pytest.raises(ValueError, match="--parity-steps 5 compares more steps"):
        ScriptDesign(TrialDesign(steps=4, warmup=1, parity_steps=5), rounds=2)
    with pytest.raises(ValueError, match="--rounds must be at least 1"):
        ScriptDesign(rounds=0)
    assert DESIGN.steps_per_run == 2 + 1 + 3


def test_a_script_that_ends_or_fails_before_its_steps_is_refused_with_why():
    ended = SideRun.from_document((), {"complete": False, "num_steps": 3, "exit_code": 0,
                                       "script_error": None, "error": "ended"})
    with pytest.raises(LeversError, match="ended after 3 optimizer step.*runs it to step 6"):
        checked_baseline(ended, "python train.py", DESIGN)
    raised = SideRun.from_document(
        (), {"complete": False, "num_steps": 1, "exit_code": 1,
             "script_error": "RuntimeError: data shard missing",
             "error": "RuntimeError: data shard missing"},
        log_tail="Traceback ...\nRuntimeError: data shard missing",
    )
    with pytest.raises(StepError, match="failed before levers tune could time its steps .*"
                                        "RuntimeError: data shard missing"):
        checked_baseline(raised, "python train.py", DESIGN)


def _probe(**more) -> dict:
    registry = load_all()
    applies = {lever: "does not fit this model" for lever in registry}
    applies.update({"ac-full": None, "inplace-scatter": None, "windowed-peak-metric": WRAPS})
    return {"applies": applies, "expected": {"inplace-scatter": [0.3, "audit COPY001: 3 ms"]},
            **more}


def test_tune_script_keeps_what_pays_and_says_why_the_rest_was_left_out(tmp_path):
    record = tmp_path / "tune.jsonl"
    script = FakeScript(probe_data=_probe())
    fake = FakeAb({"inplace-scatter": 1.3, "ac-full": 0.8})
    result = tune_script(
        ["python", "train.py", "--steps", "40"], budget_s=600, design=DESIGN, run_side=script,
        measure=fake, clock=fake.clock, record_path=record,
    )
    # the probe (with the applies check), then the repeat check: both without levers
    assert script.calls == [((), True), ((), False)]
    assert result.stack == ("inplace-scatter",)
    assert result.apply_line == 'handle = levers.apply(model, "inplace-scatter", optimizer=opt)'
    assert result.ab_command is None  # levers ab builds sides from a factory
    assert result.reproduce_command == (
        "levers tune --lever inplace-scatter --steps 6 --warmup 1 --rounds 2 -- python train.py "
        "--steps 40"
    )
    outcomes = {o.lever: o for o in result.outcomes}
    assert outcomes["inplace-scatter"].source == "audit COPY001: 3 ms"
    assert outcomes["raise-batch"].reason == NEEDS_FACTORY
    assert outcomes["windowed-peak-metric"].reason == f"does not apply: {WRAPS}"
    # its catalogue rows all measured it slower: left out of a speed search, with why
    assert outcomes["ac-full"].reason.startswith("measured slower: the catalogue")
    shown = io.StringIO()
    print_tune(result, Console(file=shown, width=400))
    text = shown.getvalue()
    assert "levers tune -- python train.py --steps 40 on cpu" in text
    assert "proven stack: inplace-scatter" in text
    assert f"  {result.apply_line}\n" in text and f"  {result.reproduce_command}\n" in text
    events = [json.loads(line) for line in record.read_text().splitlines()]
    assert [e["event"] for e in events] == ["tune-trial"] * len(fake.calls) + ["tune-result"]
    assert events[-1]["script"] == ["python", "train.py", "--steps", "40"]
    assert events[-1]["stack"] == ["inplace-scatter"]


def test_an_unrepeatable_script_is_answered_without_a_b(tmp_path):
    script = FakeScript(probe_data=_probe(), noise=0.5)
    fake = FakeAb({"inplace-scatter": 1.3})
    result = tune_script(["python", "train.py"], budget_s=600, design=DESIGN, run_side=script,
                         measure=fake, clock=fake.clock)
    assert fake.calls == [] and result.stack == ()
    assert result.not_tried.startswith("parity cannot be checked on this script")
    assert {o.reason for o in result.outcomes if o.lever == "inplace-scatter"} == {
        "not tried: parity cannot be checked on this script"
    }
    shown = io.StringIO()
    print_tune(result, Console(file=shown, width=400))
    assert "nothing tried: parity cannot be checked on this script" in shown.getvalue()
    assert "nothing pays here" not in shown.getvalue()


def test_unknown_levers_are_refused_before_the_script_runs():
    script = FakeScript()
    with pytest.raises(ValueError, match="unknown lever 'nope'"):
        tune_script(["python", "train.py"], budget_s=60, only=["nope"], run_side=script)
    assert script.calls == []


def test_the_audit_may_print_levers_tune_for_a_script():
    from levers.audit.recommend import tune_takes_scripts

    assert tune_takes_scripts() is True
