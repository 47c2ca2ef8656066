"""``levers tune -- python train.py`` without running a script: the A/B over one run of the
script (windows of the two sides alternating, paired CI95, loss parity against the runs without
levers, the repeat check), the search around it, and what is refused. The runs are fakes with the
fields a run of ``levers.integrations.script_trial`` writes; tests/tune/test_script_tune.py runs
the real script."""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field, replace

import pytest
from fakes import FakeAb
from rich.console import Console

from levers.ab.verdict import DAMAGED, NOT_MEASURED, PARITY
from levers.errors import LeversError, StepError
from levers.integrations.script_trial import window_plan
from levers.levers import load_all
from levers.tune.candidates import NEEDS_FACTORY
from levers.tune.measure import TrialDesign
from levers.tune.render import print_tune
from levers.tune.options import TuneOptions
from levers.tune.script import (
    NOT_REPEATABLE,
    ScriptDesign,
    TrialRun,
    checked_baseline,
    paired_steps,
    script_measure,
    stack_tolerance,
    tune_script,
)
from levers.tune.trial import judge
from levers.vocab import EXACT

DESIGN = ScriptDesign(TrialDesign(steps=6, warmup=1, parity_steps=2, resamples=200), rounds=2)
OPTIONS = TuneOptions(budget_s=600, design=DESIGN.trial, rounds=DESIGN.rounds)
LOSSES = (5.0, 4.5)  # the parity steps: script steps 3 and 4
WRAPS = "it wraps the training step (...)"


def _document(candidate, baseline, step_s, losses=LOSSES, rounds=2, **data) -> dict:
    """What a run of script_trial writes: ``step_s[side]`` the timed steps of each window."""
    stacks = {"candidate": candidate, "baseline": baseline}
    windows = [
        {"side": side, "stack": list(stacks[side]), "step_s": list(step_s[side]),
         "peak_allocated_bytes": None}
        for r in range(rounds)
        for side in (("candidate", "baseline") if r % 2 == 0 else ("baseline", "candidate"))
    ]
    return {"complete": True, "windows": windows, "parity_losses": list(losses),
            "device": "cpu", "model": "TinyLM", "optimizer": "AdamW", "warmup": 2,
            "param_dtype": "float32", **data}


@dataclass
class FakeScript:
    """Runs of a script: each lever makes its steps ``speed[lever]`` times faster; ``loss_shift``
    moves a lever's parity losses; ``noise`` moves the losses of every second run without levers
    (an unseeded script)."""

    speed: dict[str, float] = field(default_factory=dict)
    loss_shift: dict[str, float] = field(default_factory=dict)
    noise: float = 0.0
    fail: dict[str, str] = field(default_factory=dict)
    probe_data: dict = field(default_factory=dict)
    calls: list[dict] = field(default_factory=list)

    def __call__(self, candidate, baseline, timeout_s, *, rounds=None, probe=False, audit=False,
                 draws_random=None) -> TrialRun:
        self.calls.append(dict(candidate=tuple(candidate), baseline=tuple(baseline),
                               rounds=rounds, probe=probe, draws_random=draws_random))
        for side, stack in (("candidate", candidate), ("baseline", baseline)):
            for lever in stack:
                if lever in self.fail:
                    return TrialRun.from_document({
                        "complete": False, "error": self.fail[lever], "failed_side": side,
                        "num_steps": 3})
        shift = sum(self.loss_shift.get(lever, 0.0) for lever in candidate)
        plain_runs = sum(1 for c in self.calls if not c["candidate"])
        if not candidate and plain_runs % 2 == 0:
            shift += self.noise

        def steps(stack):
            factor = 1.0
            for lever in stack:
                factor *= self.speed.get(lever, 1.0)
            # steps of slightly different lengths, as a real run has; the same in each window
            return [0.10 / factor, 0.11 / factor, 0.09 / factor]

        extra = dict(self.probe_data) if probe else {}
        return TrialRun.from_document(_document(
            candidate, baseline, {"candidate": steps(candidate), "baseline": steps(baseline)},
            [x * (1 + shift) for x in LOSSES], rounds=DESIGN.rounds if rounds is None else rounds,
            **extra,
        ))


def _registry_tolerance(levers):
    return stack_tolerance(levers, load_all(), False, None)


def _measure(script, **kwargs):
    return script_measure(script, DESIGN, reference=LOSSES, tolerance_of=_registry_tolerance,
                          **kwargs)


def test_one_run_per_a_b_its_windows_paired_and_a_faster_stack_with_parity_pays():
    script = FakeScript(speed={"ac-full": 2.0})
    trial = _measure(script, draws_random=True)((), ("ac-full",), None)
    assert script.calls == [dict(candidate=("ac-full",), baseline=(), rounds=None, probe=False,
                                 draws_random=True)]
    assert trial.parity == PARITY
    assert "steps 3-4" in trial.parity_note
    assert trial.tokens_per_s_ratio == pytest.approx(2.0)
    low, high = trial.tokens_per_s_ci95
    assert 1.0 < low <= 2.0 <= high
    assert trial.step_time_ratio == pytest.approx(0.5)
    assert trial.step_ms == pytest.approx((100.0, 50.0))
    assert trial.peak_allocated_bytes is None and trial.peak_verdict == NOT_MEASURED
    assert trial.decision == "IMPROVED"
    assert "2 window(s) of each side alternating (candidate first); 6 paired steps" in (
        trial.warnings[0])
    assert judge(trial)[0] is True


def test_pairs_are_the_same_step_of_the_same_round_of_each_side():
    run = TrialRun.from_document({"complete": True, "windows": [
        {"side": "candidate", "step_s": [1.0, 2.0]}, {"side": "baseline", "step_s": [10.0, 20.0]},
        {"side": "candidate", "step_s": [3.0]}, {"side": "baseline", "step_s": [30.0, 40.0]},
    ]})
    assert paired_steps(run) == ([10.0, 20.0, 30.0], [1.0, 2.0, 3.0])


def test_an_increment_runs_the_kept_stack_in_the_baseline_windows():
    script = FakeScript(speed={"ac-full": 2.0, "rms-norm-fused": 1.5})
    trial = _measure(script)(("ac-full",), ("ac-full", "rms-norm-fused"), None)
    assert [(c["candidate"], c["baseline"]) for c in script.calls] == [
        (("ac-full", "rms-norm-fused"), ("ac-full",))
    ]
    assert trial.tokens_per_s_ratio == pytest.approx(1.5)


def test_an_increment_s_parity_is_its_whole_stack_against_the_runs_without_levers():
    # ac-full is exact; rms-norm-fused changes numerics (1e-5): the stack is held to 1e-4, and
    # its losses are compared with those of the runs without levers, not the kept stack's
    script = FakeScript(loss_shift={"ac-full": 5e-5})
    tolerances = []

    def tolerance_of(stack):
        tolerances.append(stack)
        return _registry_tolerance(stack)

    trial = script_measure(script, DESIGN, reference=LOSSES, tolerance_of=tolerance_of)(
        ("ac-full",), ("ac-full", "rms-norm-fused"), None
    )
    assert tolerances == [("ac-full", "rms-norm-fused")]
    assert trial.parity == PARITY, trial.parity_note
    exact = _measure(FakeScript(loss_shift={"ac-full": 5e-5}))((), ("ac-full",), None)
    assert exact.parity == DAMAGED  # alone, ac-full is held to exact's 1e-6


def test_a_loss_beyond_the_tolerance_is_damaged_and_does_not_pay():
    script = FakeScript(speed={"rms-norm-fused": 2.0}, loss_shift={"rms-norm-fused": 0.01})
    trial = _measure(script)((), ("rms-norm-fused",), None)
    assert trial.parity == DAMAGED
    assert "the loss of step 3 of the script differs by" in trial.parity_note
    assert trial.decision == DAMAGED
    pays, why = judge(trial)
    assert not pays and why.startswith("failed parity")


def test_parity_is_not_checked_when_the_runs_without_levers_do_not_repeat():
    script = FakeScript(speed={"ac-full": 2.0})
    trial = _measure(script, repeat=[0.5, 0.0])((), ("ac-full",), None)
    assert trial.parity == NOT_MEASURED
    assert trial.parity_note.startswith(NOT_REPEATABLE)
    assert "seed the script" in trial.parity_note
    pays, why = judge(trial)
    assert not pays and why.startswith("parity could not be checked")


def test_no_loss_seen_is_not_checked():
    def run_script(candidate, baseline, timeout_s, **_):
        return TrialRun.from_document(_document(
            candidate, baseline, {"candidate": [0.05] * 3, "baseline": [0.1] * 3},
            losses=(None, None)))

    trial = script_measure(run_script, DESIGN, reference=LOSSES,
                           tolerance_of=_registry_tolerance)((), ("ac-full",), None)
    assert trial.parity == NOT_MEASURED
    assert "no scalar loss passed to backward() in step 3" in trial.parity_note


def test_a_stack_that_breaks_the_script_is_a_failed_trial_with_its_error():
    script = FakeScript(fail={"compile-blocks": "RuntimeError: dynamo failed"})
    trial = _measure(script)((), ("compile-blocks",), None)
    assert trial.decision == "FAILED"
    assert trial.error == "the stack failed in the script: RuntimeError: dynamo failed"
    trial = _measure(script)(("compile-blocks",), ("compile-blocks", "ac-full"), None)
    assert trial.error == "the stack failed in the script: RuntimeError: dynamo failed"

    def baseline_window_fails(candidate, baseline, timeout_s, **_):
        # the candidate's window ran; the script raised once its levers were undone
        return TrialRun.from_document({"complete": False, "failed_side": "baseline",
                                       "error": "RuntimeError: out of data"})

    trial = script_measure(baseline_window_fails, DESIGN, reference=LOSSES,
                           tolerance_of=_registry_tolerance)(("ac-full",), ("ac-full", "x"), None)
    assert trial.error == (
        "the baseline side (ac-full, after the candidate's levers were undone) failed in the "
        "script: RuntimeError: out of data"
    )


@pytest.mark.parametrize("side, whose", [
    ("candidate", "the stack's (ac-full,x) loss is nan at optimizer step 6"),
    ("baseline", "the baseline side's (ac-full, after the candidate's levers were undone) loss "
                 "is nan at optimizer step 9"),
])
def test_a_nonfinite_loss_in_either_side_kills_the_a_b(side, whose):
    step = 6 if side == "candidate" else 9

    def nan_run(candidate, baseline, timeout_s, **_):
        # the timed windows had run before the NaN: none of their steps may be judged
        return TrialRun.from_document({
            **_document(candidate, baseline, {"candidate": [0.05] * 3, "baseline": [0.1] * 3}),
            "complete": False, "failed_side": side, "error": "the loss ... is nan",
            "nonfinite": {"step": step, "loss": "nan", "side": side, "stack": []},
        })

    trial = script_measure(nan_run, DESIGN, reference=LOSSES, tolerance_of=_registry_tolerance)(
        ("ac-full",), ("ac-full", "x"), None)
    assert trial.decision == "KILLED" and trial.killed_kind == "nonfinite_loss"
    assert trial.killed.startswith(whose)
    assert trial.tokens_per_s_ratio is None and trial.step_ms is None  # nothing judged
    pays, why = judge(trial)
    assert not pays and why.startswith("the A/B was stopped: " + whose)


def test_a_script_whose_loss_is_nonfinite_without_levers_is_refused():
    nan = TrialRun.from_document({
        "complete": False, "num_steps": 7, "exit_code": 0, "script_error": None,
        "error": "...", "nonfinite": {"step": 7, "loss": "nan", "side": "baseline", "stack": []},
    })
    with pytest.raises(LeversError, match=(
        r"python train.py: the loss passed to backward\(\) is nan at optimizer step 7 of the "
        "script, with no lever applied; .* fix the script's loss")):
        checked_baseline(nan, "python train.py", DESIGN, DESIGN.steps_per_run)


def test_tune_script_refuses_a_script_whose_probe_saw_a_nonfinite_loss():
    probe = {"complete": False, "num_steps": 3, "exit_code": 0, "script_error": None,
             "nonfinite": {"step": 3, "loss": "inf", "side": "candidate", "stack": []}}
    script = FakeScript()

    def run_script(candidate, baseline, timeout_s, **kwargs):
        script(candidate, baseline, timeout_s, **kwargs)
        return TrialRun.from_document(probe)

    with pytest.raises(LeversError, match="is inf at optimizer step 3 of the script"):
        tune_script(["python", "train.py"], OPTIONS, run_script=run_script, measure=FakeAb({}))
    assert len(script.calls) == 1  # refused after the probe, before any A/B


def test_a_run_past_the_time_left_stops_the_a_b():
    def timed_out(candidate, baseline, timeout_s, **_):
        assert timeout_s == 5.0  # the A/B's time left is the run's kill line
        return TrialRun(complete=False, timed_out=True, error="too long")

    trial = script_measure(timed_out, DESIGN, reference=LOSSES,
                           tolerance_of=_registry_tolerance)((), ("ac-full",), 5.0)
    assert trial.killed_kind == "time_budget" and trial.out_of_time
    assert "the A/B's run of the script" in trial.killed


def test_the_tolerance_is_ab_s_for_the_declared_safety_or_the_lever_s_where_looser():
    registry = load_all()
    exact = stack_tolerance(("ac-full",), registry, False, None)
    assert exact.exactness == EXACT and exact.rtol_first == 1e-6
    numerics = stack_tolerance(("ac-full", "rms-norm-fused"), registry, False, None)
    assert numerics.exactness != EXACT and numerics.rtol_first == 1e-4
    assert stack_tolerance(("autocast-bf16",), registry, False, None).rtol_first == 0.05
    assert stack_tolerance(("ac-full",), registry, True, "bfloat16").rtol_last == 1e-2
    floor = registry["float8"].parity_floor
    assert floor and stack_tolerance(("compile-blocks", "float8"), registry, True,
                                     "bfloat16").rtol_first >= floor


def test_the_design_lays_out_the_windows_c_b_b_c():
    with pytest.raises(ValueError, match="--rounds must be at least 1"):
        ScriptDesign(rounds=0)
    plan = window_plan(("ac-full",), (), parity=2, untimed=1, timed=3, rounds=2)
    # each pair in the other order from the one before; untimed steps after a switch only
    assert [(w.side, w.stack, w.parity, w.untimed, w.timed) for w in plan] == [
        ("candidate", ("ac-full",), 2, 1, 3), ("baseline", (), 0, 1, 3),
        ("baseline", (), 0, 0, 3), ("candidate", ("ac-full",), 0, 1, 3),
    ]
    assert [w.side[0] for w in window_plan((), (), parity=1, untimed=1, timed=1, rounds=3)] == (
        list("cbbccb")
    )
    assert [w.num_steps for w in window_plan((), (), parity=2, untimed=1, timed=3, rounds=0)] == [2]
    # the steps a run must reach: 2 before the levers, then the plan's
    for rounds in (1, 2, 3):
        design = ScriptDesign(TrialDesign(steps=6, warmup=1, parity_steps=2), rounds=rounds)
        laid_out = window_plan((), (), parity=2, untimed=1, timed=design.timed_per_window,
                               rounds=rounds)
        assert design.steps_per_run == 2 + sum(w.num_steps for w in laid_out)
    assert DESIGN.steps_per_run == 2 + 2 + 3 * 1 + 4 * 3
    assert DESIGN.repeat_steps == 4
    assert ScriptDesign().steps_per_run == 54


def test_the_steps_a_run_needs_are_the_ones_the_audit_prints():
    from levers.script_defaults import TUNE_SCRIPT_STEPS

    # the audit's printed `levers tune -- python train.py` runs the script this far (defect N4)
    assert TUNE_SCRIPT_STEPS == ScriptDesign().steps_per_run
    # the --steps said to fit a shorter script does fit it, and one more per window does not
    for num_steps in (34, 40, 41, 54, 100):
        steps = ScriptDesign().steps_that_fit(num_steps)
        fitted = ScriptDesign(TrialDesign(steps=steps))
        assert fitted.steps_per_run <= num_steps < ScriptDesign(
            TrialDesign(steps=steps + fitted.rounds)).steps_per_run
    assert ScriptDesign().steps_that_fit(33) is None  # 8 timed steps per side: too few


def test_a_script_that_ends_or_fails_before_its_steps_is_refused_with_why():
    ended = TrialRun.from_document({"complete": False, "num_steps": 3, "exit_code": 0,
                                    "script_error": None, "error": "ended"})
    with pytest.raises(LeversError, match=(
            "ended after 3 optimizer step.*runs it to its optimizer step 19 each time.*let the "
            r"script run at least 19 optimizer steps \(its own steps argument\) \(--steps alone "
            "cannot fit the runs to its 3 steps: that would time fewer than 10 steps per side")):
        checked_baseline(ended, "python train.py", DESIGN, DESIGN.steps_per_run)
    # a script long enough for a smaller design is told the --steps that fits it
    ended_at_40 = TrialRun.from_document({"complete": False, "num_steps": 40, "exit_code": 0,
                                          "script_error": None, "error": "ended"})
    with pytest.raises(LeversError, match=(
            "let the script run at least 54 optimizer steps .*, or fit the runs to its 40 steps "
            "with --steps 12$")):
        checked_baseline(ended_at_40, "python train.py", ScriptDesign(), 54)
    raised = TrialRun.from_document(
        {"complete": False, "num_steps": 1, "exit_code": 1,
         "script_error": "RuntimeError: data shard missing",
         "error": "RuntimeError: data shard missing"},
        log_tail="Traceback ...\nRuntimeError: data shard missing",
    )
    with pytest.raises(StepError, match="failed before levers tune could time its steps .*"
                                        "RuntimeError: data shard missing"):
        checked_baseline(raised, "python train.py", DESIGN, DESIGN.steps_per_run)


def _probe(**more) -> dict:
    registry = load_all()
    applies = {lever: "does not fit this model" for lever in registry}
    applies.update({"ac-full": None, "inplace-scatter": None, "windowed-peak-metric": WRAPS})
    return {"applies": applies, "expected": {"inplace-scatter": [0.3, "audit COPY001: 3 ms"]},
            **more}


def _tuned_with_names(**names):
    found = {"model": None, "optimizer": None, "model_class": "Net", "optimizer_class": "AdamW",
             "framework": None, "trainer": None, **names}
    script = FakeScript(probe_data=_probe(names=found))
    fake = FakeAb({"inplace-scatter": 1.3, "ac-full": 0.8})
    return tune_script(["python", "train.py", "--steps", "40"], OPTIONS, run_script=script,
                       measure=fake, clock=fake.clock)


def test_the_apply_line_of_a_script_uses_the_names_its_probe_found():
    """Defect N15: the line said model and opt whatever the script called them."""
    result = _tuned_with_names(model="net", optimizer="sgd")
    assert result.apply_line == 'handle = levers.apply(net, "inplace-scatter", optimizer=sgd)'
    assert result.apply_note == "once net and sgd are built, before the training loop"
    shown = io.StringIO()
    print_tune(result, Console(file=shown, width=400))
    assert "  (once net and sgd are built, before the training loop)\n" in shown.getvalue()


def test_a_trainer_script_is_tuned_into_the_trainer_callback():
    result = _tuned_with_names(model="trainer.model", framework="transformers", trainer="trainer")
    assert result.apply_line == (
        'trainer = Trainer(..., callbacks=[LeversCallback(levers="inplace-scatter")])'
    )
    assert result.apply_note.startswith("from levers.integrations.transformers import LeversCallback")


def test_tune_script_keeps_what_pays_and_says_why_the_rest_was_left_out(tmp_path):
    record = tmp_path / "tune.jsonl"
    script = FakeScript(probe_data=_probe())
    fake = FakeAb({"inplace-scatter": 1.3, "ac-full": 0.8})
    result = tune_script(
        ["python", "train.py", "--steps", "40"], replace(OPTIONS, record_path=record),
        run_script=script, measure=fake, clock=fake.clock,
    )
    # the probe (with the applies check, as long as an A/B's run), then the repeat check (the
    # parity steps alone): both without levers
    assert [(c["candidate"], c["baseline"], c["rounds"], c["probe"]) for c in script.calls] == [
        ((), (), None, True), ((), (), 0, False)
    ]
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
    result = tune_script(["python", "train.py"], OPTIONS, run_script=script, measure=fake,
                         clock=fake.clock)
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
        tune_script(["python", "train.py"], TuneOptions.checked(budget=60, levers=["nope"]),
                    run_script=script)
    assert script.calls == []


def test_the_probe_s_findings_reach_the_search_and_the_a_bs():
    applies = _probe()["applies"]
    applies["compile-model"] = None
    probe = _probe(applies=applies, device="cuda:0", forward_draws_random=True,
                   slower={"inplace-scatter": "its kernel is slower on this GPU"},
                   forms={"compile-model": ["compile-model:mode=default"]})
    script = FakeScript(probe_data=probe)
    result = tune_script(["python", "train.py"], replace(OPTIONS, only=("compile-model",)),
                         run_script=script)
    # compile-model's other form (inductor's default mode beside CUDA graphs) is tried too, and
    # each A/B's run is told that the model's forward draws random numbers
    assert [(c["candidate"], c["draws_random"]) for c in script.calls[2:]] == [
        (("compile-model",), True), (("compile-model:mode=default",), True)
    ]
    assert any("draws random numbers (dropout)" in note for note in result.notes)
    script = FakeScript(probe_data=probe)
    result = tune_script(["python", "train.py"], replace(OPTIONS, exclude=("compile-model",)),
                         run_script=script, measure=FakeAb({}))
    outcomes = {o.lever: o for o in result.outcomes}
    assert outcomes["inplace-scatter"].reason == (
        "measured slower in this regime: its kernel is slower on this GPU"
    )


def test_the_audit_may_print_levers_tune_for_a_script():
    from levers.audit.recommend import tune_takes_scripts

    assert tune_takes_scripts() is True
