"""Claims from measurement (levers.tune.claims), on a CPU with a fake A/B: the audit's levers
measured on the step, the estimates replaced, the stack proven or not."""

from __future__ import annotations

import pytest
from fakes import FakeAb

import levers
from levers.audit.recommend import provenance_line
from levers.tune.claims import EAGER_RANDOM_NOTE

SPEEDS = {
    "compile-blocks": 1.3,
    "inplace-scatter": 1.1,
    "sdpa-attention": 0.9,
    "sdpa-cudnn-backend": 1.0,
    "ac-full": 0.7,
    "loss-valid-rows": 1.2,
}


@pytest.fixture(scope="module")
def step():
    step = levers.Step("demo", params={"size": "tiny"})
    step.capture()
    return step


def _measured(step, fake):
    return step.audit(memory_model=False, measure=fake)


def test_a_cpu_capture_keeps_its_estimates_and_says_so(step):
    audited = step.audit(memory_model=False)
    assert audited.claims is None
    rec = audited.result.recommendation
    assert rec.provenance == "estimated"
    assert provenance_line(rec).startswith("estimated, not measured on this step")


def test_each_lever_is_measured_alone_and_the_stack_as_a_stack(step):
    fake = FakeAb(SPEEDS, damaged=frozenset({"loss-valid-rows"}))
    audited = _measured(step, fake)
    estimated = step.audit(memory_model=False).result.recommendation.levers
    assert fake.calls[: len(estimated)] == [((), (lever,)) for lever in estimated]
    claims = audited.claims
    assert claims.stack == ("inplace-scatter", "compile-blocks")
    assert fake.calls[-1] == ((), ("inplace-scatter", "compile-blocks"))
    assert claims.proven
    rec = audited.result.recommendation
    assert rec.levers == ("inplace-scatter", "compile-blocks")
    assert rec.provenance == "proven"
    assert rec.command.endswith("--lever inplace-scatter,compile-blocks")
    assert provenance_line(rec).startswith("proven on this step: tokens/s 1.430x")
    assert "levers tune demo --set size=tiny" in provenance_line(rec)


def test_a_measured_saving_replaces_the_estimate_on_the_findings(step):
    audited = _measured(step, FakeAb(SPEEDS))
    by_lever = {c.lever: c for c in audited.claims.claims}
    compile_claim = by_lever["compile-blocks"]
    assert compile_claim.measured_ms == pytest.approx(10.0 - 10.0 / 1.3)
    asking = [f for f in audited.findings if "measured" in f.details
              and f.details["measured"]["lever"] == "compile-blocks"]
    assert asking and all(f.cost.provenance == "measured" for f in asking)
    # the measured saving is shared between the findings that asked for the lever
    assert sum(f.cost.saved_ms for f in asking) == pytest.approx(compile_claim.measured_ms)
    assert "measured: compile-blocks A/B'd on this step" in asking[0].cost.basis


def test_a_lever_measured_not_to_pay_is_not_recommended_and_says_what_was_measured(step):
    fake = FakeAb(SPEEDS, damaged=frozenset({"loss-valid-rows"}))
    audited = _measured(step, fake)
    loss = next(f for f in audited.findings if f.code == "LOSS001")
    assert loss.details["recommended"] is False
    assert "Measured on this step: loss-valid-rows failed parity" in loss.message
    slow = next(f for f in audited.findings if f.code == "ATTN002")
    assert "sdpa-attention slower: tokens/s 0.900x" in slow.message
    assert "sdpa-attention" not in audited.result.recommendation.levers


def test_a_stack_that_does_not_pay_together_falls_back_to_its_best_lever(step):
    fake = FakeAb(
        SPEEDS, damaged=frozenset({"loss-valid-rows"}),
        together={("inplace-scatter", "compile-blocks"): 0.97},
    )
    audited = _measured(step, fake)
    assert audited.claims.stack == ("compile-blocks",)
    rec = audited.result.recommendation
    assert rec.levers == ("compile-blocks",) and rec.provenance == "proven"
    assert any("measured as a stack" in note for note in rec.notes)


def test_nothing_that_pays_leaves_no_stack(step):
    audited = _measured(step, FakeAb({lever: 0.95 for lever in SPEEDS}))
    assert audited.claims.stack == () and not audited.claims.proven
    rec = audited.result.recommendation
    assert rec.levers == () and rec.command is None


def test_measuring_is_on_by_default_only_for_a_gpu_capture_of_a_spec_without_a_target(monkeypatch):
    from types import SimpleNamespace

    import levers.tune.measure

    sentinel = FakeAb(SPEEDS)
    monkeypatch.setattr(levers.tune.measure, "ab_measure", lambda spec, params, design, sides="together": sentinel)

    def is_ab(measure):  # ab's A/B on this step (remembered per Step), or None
        if measure is None:
            return False
        before = len(sentinel.calls)
        measure((), (f"lever-{before}",), None)
        return len(sentinel.calls) == before + 1

    gpu = SimpleNamespace(env={"device": "cuda:0"})
    cpu = SimpleNamespace(env={"device": "cpu"})
    step = levers.Step("demo", params={"size": "tiny"})
    assert is_ab(step._claims_measure(None, gpu, None))
    assert step._claims_measure(None, gpu, "h100") is None  # --target: estimates
    assert step._claims_measure(None, cpu, None) is None
    assert step._claims_measure(False, gpu, None) is None
    assert is_ab(step._claims_measure(True, cpu, None))
    built = levers.Step(step.workload())
    assert built._claims_measure(None, gpu, None) is None
    with pytest.raises(TypeError, match="make the Step from a spec"):
        built._claims_measure(True, gpu, None)


def test_the_other_form_of_a_lever_is_measured_and_recommended_when_it_pays_more(step):
    fake = FakeAb({**SPEEDS, "compile-model": 2.0})
    audited = _measured(step, fake)
    estimated = step.audit(memory_model=False).result.recommendation.levers
    assert "compile-blocks" in estimated and "compile-model" not in estimated
    # the audit's own levers first, each alone, then the other form, then the stack
    assert fake.calls[: len(estimated)] == [((), (lever,)) for lever in estimated]
    assert fake.calls[len(estimated)] == ((), ("compile-model",))
    rec = audited.result.recommendation
    assert "compile-model" in rec.levers and "compile-blocks" not in rec.levers
    assert rec.command.endswith("--lever " + ",".join(rec.levers))
    by_lever = {c.lever: c for c in audited.claims.claims}
    assert by_lever["compile-model"].alternative_of == "compile-blocks"
    elem = next(f for f in audited.findings if f.code == "ELEM001")
    assert elem.details["levers"][0] == "compile-model"
    assert elem.details["measured"]["lever"] == "compile-model"
    assert "compile-model, the other form of compile-blocks, tokens/s 2.000x" in elem.message
    assert any("compile-blocks measured on this step: pays" in n and "compile-model" in n
               for n in rec.notes)


def test_an_other_form_that_pays_less_leaves_the_rules_choice(step):
    fake = FakeAb({**SPEEDS, "compile-model": 1.1})
    audited = _measured(step, fake)
    rec = audited.result.recommendation
    assert "compile-blocks" in rec.levers and "compile-model" not in rec.levers
    assert ((), ("compile-model",)) in fake.calls
    elem = next(f for f in audited.findings if f.code == "ELEM001")
    assert elem.details["measured"]["lever"] == "compile-blocks"


def test_a_step_runs_each_ab_once_for_its_audit_and_its_tune(monkeypatch):
    """The audit's measured claims are tune's first increments: one Step runs each A/B once."""
    import dataclasses

    import levers.tune.measure as measure_mod

    fake = FakeAb(SPEEDS)
    monkeypatch.setattr(measure_mod, "ab_measure", lambda spec, params, design=None, sides="together": fake)
    step = levers.Step("demo", params={"size": "tiny"})
    step.capture()
    step.audit(memory_model=False, measure=True)
    after_audit = list(fake.calls)
    assert ((), ("compile-blocks",)) in after_audit
    step.tune(budget="10m", levers=["compile-blocks"], record=None)
    assert fake.calls.count(((), ("compile-blocks",))) == 1
    # a trial the time budget cut short is not remembered
    memory: dict = {}
    killed = dataclasses.replace(fake((), ("ac-full",), None), killed_kind="time_budget")
    once = measure_mod.remembered(lambda b, s, t: killed, memory)
    once((), ("ac-full",), 1.0)
    assert memory == {}


def test_forms_of_a_workload_without_tokens_are_chosen_by_step_time(step):
    """A workload that counts no tokens has no tokens/s ratio: the faster form is chosen by its
    step-time ratio, as tune chooses between alternatives."""
    import dataclasses

    fake = FakeAb({**SPEEDS, "compile-model": 2.0})

    def no_tokens(base, stack, budget):
        return dataclasses.replace(fake(base, stack, budget), tokens_per_s_ratio=None,
                                   tokens_per_s_ci95=None)

    audited = _measured(step, no_tokens)
    rec = audited.result.recommendation
    assert "compile-model" in rec.levers and "compile-blocks" not in rec.levers
    assert any("paid more (2.000x)" in n for n in rec.notes)


def _asking_for_float8(step, monkeypatch):
    """The demo's audit with float8 as its stack (DTYPE003 fires only on float8-sized linears,
    which the tiny demo has not), as the recommendation every re-recommendation returns."""
    import dataclasses

    import levers.tune.claims as claims_mod

    audited = step.audit(memory_model=False)
    rec = dataclasses.replace(
        audited.result.recommendation, levers=("float8",), codes=("DTYPE003",),
        command="levers ab demo --set size=tiny --lever float8",
    )
    monkeypatch.setattr(claims_mod, "recommend", lambda *args, **kwargs: rec)
    return dataclasses.replace(
        audited, result=dataclasses.replace(audited.result, recommendation=rec)
    )


def test_a_lever_that_pays_only_on_another_is_measured_on_top_of_it_and_joins_with_it(
    step, monkeypatch
):
    from levers.tune.claims import measured_audit

    audited = _asking_for_float8(step, monkeypatch)
    fake = FakeAb({"compile-blocks": 1.3, "float8": 1.1})
    out = measured_audit(audited, fake, workload_spec="demo", set_items=["size=tiny"])
    # float8's casts fuse only compiled: its A/B is the increment over compile-blocks
    assert fake.calls[0] == (("compile-blocks",), ("compile-blocks", "float8"))
    claims = {claim.lever: claim for claim in out.claims.claims}
    # float8-rowwise, its other form, on top of compile-blocks as well
    assert (("compile-blocks",), ("compile-blocks", "float8-rowwise")) in fake.calls
    claim = claims["float8"]
    assert claim.pays and claim.measured_ms == pytest.approx(10.0 - 10.0 / 1.1)
    # the stack it paid in is proven as a stack against the baseline
    assert fake.calls[-1] == ((), ("compile-blocks", "float8"))
    assert out.claims.stack == ("compile-blocks", "float8") and out.claims.proven
    rec = out.result.recommendation
    assert rec.levers == ("compile-blocks", "float8")
    assert rec.codes == ("DTYPE003", "DTYPE003")
    assert rec.command.endswith("--lever compile-blocks,float8")


def test_an_increment_that_does_not_hold_as_a_stack_proves_nothing_alone(step, monkeypatch):
    from levers.tune.claims import measured_audit

    audited = _asking_for_float8(step, monkeypatch)
    fake = FakeAb(
        {"compile-blocks": 1.3, "float8": 1.1}, together={("compile-blocks", "float8"): 0.98}
    )
    out = measured_audit(audited, fake, workload_spec="demo", set_items=["size=tiny"])
    # float8's own A/B was against compile-blocks, not the baseline: no lever is left proven
    assert out.claims.stack == () and not out.claims.proven
    assert any("measured as a stack" in note for note in out.result.recommendation.notes)


def test_a_lever_that_did_not_pay_on_top_of_another_says_on_what(step, monkeypatch):
    from levers.tune.claims import measured_audit

    audited = _asking_for_float8(step, monkeypatch)
    fake = FakeAb({"compile-blocks": 1.3, "float8": 0.95})
    out = measured_audit(audited, fake, workload_spec="demo", set_items=["size=tiny"])
    assert out.claims.stack == ()
    assert any(
        note.startswith("float8 (on top of compile-blocks) measured on this step: slower")
        for note in out.result.recommendation.notes
    )


def test_a_lever_whose_base_cannot_be_built_is_measured_alone(step, monkeypatch):
    from levers.tune.claims import measured_audit

    audited = _asking_for_float8(step, monkeypatch)
    fake = FakeAb(
        {"float8": 1.1}, broken={"compile-blocks": "lever compile-blocks does not apply: no blocks"}
    )
    out = measured_audit(audited, fake, workload_spec="demo", set_items=["size=tiny"])
    assert fake.calls[:2] == [
        (("compile-blocks",), ("compile-blocks", "float8")), ((), ("float8",)),
    ]
    claims = {claim.lever: claim for claim in out.claims.claims}
    assert claims["float8"].pays and not claims["float8"].trial.base
    assert out.claims.stack == ("float8",)


def test_a_saving_timed_with_eager_random_draws_says_so(step):
    audited = _measured(step, FakeAb(SPEEDS, eager_random=frozenset({"compile-blocks"})))
    costs = {f.details["measured"]["lever"]: f.cost.basis for f in audited.findings
             if "measured" in f.details}
    assert EAGER_RANDOM_NOTE in costs["compile-blocks"]
    assert all(EAGER_RANDOM_NOTE not in basis for lever, basis in costs.items()
               if lever != "compile-blocks")
    by_lever = {c.lever: c.to_dict() for c in audited.claims.claims}
    assert by_lever["compile-blocks"]["timed_eager_random"] is True
