"""Step.tune: candidates from the real catalogue on a real workload, a fake or a real A/B, the
record, the printed lines."""

from __future__ import annotations

import gc
import json
import weakref
from pathlib import Path
from types import SimpleNamespace

import pytest
from fakes import FakeAb

import levers
from levers.tune import run
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
    # the proof is a fresh A/B, given the time left for five times the selection's 20 steps
    assert result.ab_command == "levers ab demo --set size=tiny --lever inplace-scatter --steps 100"
    assert result.proof.role == "confirmation" and result.proof.num_steps == 100
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
    assert trials[0].role == "selection" and trials[0].num_steps == 4
    selections = [t for t in trials if t.role == "selection"]
    confirmations = [t for t in trials if t.role == "confirmation"]
    assert len(selections) + len(confirmations) == len(trials)
    # a first look whose CI held 1 with a gain may be timed once more, with more steps
    assert len(selections) <= 2 and all(t.num_steps > 4 for t in selections[1:])
    assert all(a is b for a, b in zip(trials, selections))
    assert len(confirmations) <= 1
    if confirmations:  # it paid: a fresh A/B of it, asked for its own steps
        assert trials[-1] is confirmations[0] and confirmations[0].num_steps >= 4
        assert all(confirmations[0].ab is not t.ab for t in selections)
    if result.stack:
        assert result.proof is confirmations[0] and result.proof.tokens_per_s_ci95[0] > 1.0
    kinds = [e["event"] for e in _events(record)]
    assert kinds == ["tune-trial"] * len(trials) + ["tune-result"]
    assert [e["role"] for e in _events(record)[:-1]] == [t.role for t in trials]
    # each trial records every timed step of each side, as ab timed them
    for trial, event in zip(trials, _events(record)):
        baseline, candidate = event["step_ms_each"]
        assert len(baseline) == len(candidate) == trial.timed_steps
        samples = trial.ab.samples
        assert baseline == [round(ms, 3) for ms in samples["baseline"].dur_ms]
        assert candidate == [round(ms, 3) for ms in samples["candidate"].dur_ms]


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


def _shown(result) -> str:
    import io

    from rich.console import Console

    from levers.tune.render import print_tune

    out = io.StringIO()
    print_tune(result, Console(file=out, width=400))
    return out.getvalue()


@pytest.mark.parametrize(
    ("only", "why"),
    [
        ("windowed-peak-metric", "it changes nothing the step computes"),
        ("compile-blocks", "its speed-up exists only on a GPU"),
    ],
)
def test_nothing_tried_when_no_a_b_ran_is_not_nothing_pays(tmp_path, only, why):
    record = tmp_path / "r.jsonl"
    fake = FakeAb({})
    result = levers.Step("demo", params={"size": "tiny"}).tune(
        measure=fake, clock=fake.clock, audit=False, levers=only, record=record
    )
    assert fake.calls == [] and result.nothing_tried and result.nothing_pays
    assert result.why_nothing_tried.startswith("no lever can be tried on this step")
    text = _shown(result)
    assert "nothing tried: no lever can be tried on this step" in text
    assert "nothing pays here" not in text
    assert f"dropped {only}: {why}" in text
    assert _events(record)[-1]["nothing_tried"] == result.why_nothing_tried


def test_a_search_that_ran_a_b_s_is_not_nothing_tried():
    fake = FakeAb({})
    result = levers.Step("demo", params={"size": "tiny"}).tune(
        measure=fake, clock=fake.clock, audit=False, levers="inplace-scatter"
    )
    assert fake.calls and not result.nothing_tried and result.why_nothing_tried is None
    assert "nothing pays here: 1 lever(s) A/B'd, none faster" in _shown(result)


def test_ctrl_c_during_an_a_b_keeps_the_record_and_marks_the_result_interrupted(tmp_path):
    record = tmp_path / "r.jsonl"
    fake = FakeAb({"inplace-scatter": 1.3, "loss-valid-rows": 1.2})

    def interrupted_second_lever(base, stack, left_s, *, steps=None):
        if stack[-1:] == ("loss-valid-rows",):
            raise KeyboardInterrupt  # outside a step: ab's runner lets it through
        return fake(base, stack, left_s, steps=steps)

    result = levers.Step("demo", params={"size": "tiny"}).tune(
        measure=interrupted_second_lever, clock=fake.clock, audit=False, record=record,
        levers="inplace-scatter,loss-valid-rows,ac-full",
    )
    assert result.interrupted
    events = _events(record)
    assert [e["event"] for e in events] == ["tune-trial"] * 3 + ["tune-result"]
    assert events[2]["killed_kind"] == "interrupted" and events[2]["stack"][-1] == "loss-valid-rows"
    assert events[-1]["interrupted"] is True
    # inplace-scatter was confirmed against the baseline before the Ctrl-C
    assert events[-1]["stack"] == ["inplace-scatter"] and events[-1]["confirmed_by"] == 1
    text = _shown(result)
    assert "INTERRUPTED (Ctrl-C)" in text
    assert "dropped ac-full: not tried: the search was interrupted (Ctrl-C)" in text


def test_the_workload_built_for_the_candidates_is_freed_before_the_a_bs(tmp_path):
    # each A/B builds its own two sides: the one built for applies and the audit, with its
    # gradients and optimizer state, would be a third copy on the GPU through the search
    step = levers.Step("demo", params={"size": "tiny"})
    built = weakref.ref(step.workload().model)
    alive_at_a_b = []

    class Watching(FakeAb):
        def __call__(self, base, stack, time_budget_s, *, steps=None):
            gc.collect()
            alive_at_a_b.append(built() is not None)
            return super().__call__(base, stack, time_budget_s, steps=steps)

    fake = Watching({"inplace-scatter": 1.3})
    result = step.tune(measure=fake, clock=fake.clock, audit=False, levers="inplace-scatter")
    assert alive_at_a_b and not any(alive_at_a_b)
    assert result.stack == ("inplace-scatter",)
    assert step.workload().model is not None  # built again on use


def test_a_step_that_fills_more_than_half_the_gpu_is_said_to_not_fit_twice(monkeypatch):
    gib = 2**30
    props = SimpleNamespace(total_memory=140 * gib)
    monkeypatch.setattr(run.torch.cuda, "get_device_properties", lambda device: props)
    stats = lambda peak: SimpleNamespace(source="cuda-allocator", peak_bytes=peak)  # noqa: E731
    assert run.two_sides_note(stats(60 * gib), "cuda") is None
    note = run.two_sides_note(stats(80 * gib), "cuda:0")
    assert "80.0 GiB of the GPU's 140 GiB" in note and "batch_size" in note
    # the CPU's tracked storages say nothing of a GPU
    cpu_tracked = SimpleNamespace(source="tracked-storages", peak_bytes=10**15)
    assert run.two_sides_note(cpu_tracked, "cpu") is None


@pytest.mark.parametrize("crowded", [False, True])
def test_a_step_two_of_which_do_not_fit_is_tuned_with_its_sides_one_at_a_time(monkeypatch,
                                                                             crowded):
    # the audit's peak decides how each A/B holds its sides: the A/Bs are ab's, asked for sides
    note = "this step's peak is 80.0 GiB of the GPU's 140 GiB: ..." if crowded else None
    monkeypatch.setattr(run, "two_sides_note", lambda memory, device: note)
    asked = []
    fake = FakeAb({"inplace-scatter": 1.3})

    def ab_measure(spec, params, design, sides="together"):
        asked.append(sides)
        return fake

    monkeypatch.setattr("levers.tune.measure.ab_measure", ab_measure)
    # and whether per-block compile goes before whole-model compile (the cheaper compile first
    # where each A/B is dear)
    ordering, candidates = [], run.candidates
    monkeypatch.setattr(run, "candidates", lambda *a, **kw: (
        ordering.append(kw["blocks_first"]), candidates(*a, **kw))[1])
    # and whether a group's other forms wait for the later groups (each A/B is dear)
    deferring, search = [], run.search
    monkeypatch.setattr(run, "search", lambda *a, **kw: (
        deferring.append(kw["defer_alternatives"]), search(*a, **kw))[1])
    result = levers.Step("demo", params={"size": "tiny"}).tune(
        clock=fake.clock, levers="inplace-scatter"
    )
    assert asked == ["one-at-a-time" if crowded else "together"]
    assert ordering == [crowded] and deferring == [crowded]
    assert result.stack == ("inplace-scatter",)
    assert (note in result.notes) is crowded


FAILING_STEP = '''
import torch
from levers import Workload


def make(device="cpu"):
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step():
        raise ValueError("Expected input batch_size (0) to match target batch_size (62).")

    return Workload(model=model, optimizer=opt, step=step, device=device, tokens_per_step=4)
'''


def test_a_step_that_raises_is_refused_with_its_error_before_any_a_b(tmp_path, capsys):
    from levers.cli import main
    from levers.errors import StepError

    factory = tmp_path / "failing.py"
    factory.write_text(FAILING_STEP)
    fake = FakeAb({"inplace-scatter": 1.3})
    with pytest.raises(StepError, match="batch_size \\(0\\) to match target"):
        levers.Step(f"{factory}:make").tune(measure=fake, clock=fake.clock)
    assert fake.calls == []
    record = tmp_path / "r.jsonl"
    for no_audit in ([], ["--no-audit"]):
        code = main(["tune", f"{factory}:make", "--budget", "60", "--record", str(record),
                     *no_audit])
        assert code == 3
        err = capsys.readouterr().err
        assert "Expected input batch_size (0) to match target batch_size (62)" in err
        assert "nothing tried" not in err


@pytest.mark.parametrize("as_run", [True, False])
def test_the_printed_proof_says_how_its_random_numbers_were_drawn(tmp_path, as_run):
    # a proof timed on the parity steps' programs says so; one timed again as you run it says
    # that instead, and is the proof
    fake = FakeAb({"inplace-scatter": 1.3}, eager_random=frozenset({"inplace-scatter"}))
    budget = "10m" if as_run else "25s"  # the first A/B takes 10 s: 25 s hold no third
    result = levers.Step("demo", params={"size": "tiny"}).tune(
        budget=budget, measure=fake, clock=fake.clock, audit=False, levers="inplace-scatter",
        record=tmp_path / "r.jsonl",
    )
    shown = _shown(result)
    assert result.stack == ("inplace-scatter",)
    assert (fake.as_run_asked == [("inplace-scatter",)]) is as_run
    assert ("a fresh A/B against the baseline timed as you run it" in shown) is as_run
    assert ("drawn as eager draws them, as its parity was judged" in shown) is not as_run


AUTOCAST_STEP = '''
import torch
from levers import Workload


def make(device="cpu", autocast=True):
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 16)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 16)

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bool(autocast)):
            loss = model(x).float().square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    return Workload(model=model, optimizer=opt, step=step, device=device, tokens_per_step=4)
'''


@pytest.mark.parametrize("autocast", [True, False])
def test_a_step_that_autocasts_already_is_not_searched_with_autocast_bf16(tmp_path, autocast):
    # the lever's own applies sees the model and the step function, not the regions the step
    # opens; the audit's capture sees them, and a step under autocast gains nothing from it
    from levers.levers import load_all
    from levers.tune.candidates import candidates

    factory = tmp_path / "autocasting.py"
    factory.write_text(AUTOCAST_STEP)
    step = levers.Step(f"{factory}:make", params={"autocast": autocast})
    view = run._findings(step, lambda _: None)
    assert ("cpu:bfloat16" in view.autocast) is autocast
    registry = load_all()
    applies_of = run.applies_here(step.workload(), view)
    # as on a GPU, where the lever's speed-up is
    ordered, skipped = candidates(registry, applies_of, on_gpu=True, only=["autocast-bf16"])
    if autocast:
        assert ordered == []
        assert skipped[0].lever == "autocast-bf16"
        assert "already runs under bfloat16 autocast" in skipped[0].reason
    else:
        assert [c.lever for c in ordered] == ["autocast-bf16"]
    # the other levers are judged by their own applies
    other = registry["inplace-scatter"]
    assert applies_of(other) == other.applies(levers.levers.lever.target_of(step.workload()))



@pytest.mark.parametrize(("spec", "params", "left_out"), [
    ("zoo", {"model": "gpt2", "size": "tiny"}, True),  # every target counts
    ("demo", {"size": "tiny"}, False),  # the demo pads its rows
])
def test_loss_valid_rows_is_left_out_where_the_audit_saw_no_ignored_rows(spec, params, left_out):
    from levers.levers import load_all
    from levers.tune.candidates import candidates

    step = levers.Step(spec, params=params)
    view = run._findings(step, lambda _: None)
    applies_of = run.applies_here(step.workload(), view)
    ordered, skipped = candidates(load_all(), applies_of, only=["loss-valid-rows"])
    if left_out:
        assert ordered == [] and "nothing for it to fix: the audit found" in skipped[0].reason
        assert "with no padding it only adds a sync" in skipped[0].reason
    else:
        assert [c.lever for c in ordered] == ["loss-valid-rows"]
