"""levers.Step: one capture handed to every analysis; the CLIs and the in-loop capture call it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import levers
import levers.capture
import levers.memory
from levers.api import Step, _candidate_and_levers
from levers.errors import WorkloadNotFound

AB_FACTORIES = str(Path(__file__).parent / "ab" / "ab_factories.py")


def test_import_levers_stays_cheap_and_step_is_lazy():
    code = (
        "import sys, levers; heavy = [m for m in ('levers.api', 'levers.audit', 'levers.memory') "
        "if m in sys.modules]; print(heavy); print(levers.Step.__module__)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout == "[]\nlevers.api\n"


@pytest.fixture
def counted(monkeypatch):
    """How often the step is captured and the memory model is run (the real ones run)."""
    calls = {"capture": 0, "predict": 0}
    real_capture, real_predict = levers.capture.capture_step, levers.memory.predict_memory

    def capture(*args, **kwargs):
        calls["capture"] += 1
        return real_capture(*args, **kwargs)

    def predict(*args, **kwargs):
        calls["predict"] += 1
        return real_predict(*args, **kwargs)

    monkeypatch.setattr(levers.capture, "capture_step", capture)
    monkeypatch.setattr(levers.memory, "predict_memory", predict)
    return calls


@pytest.mark.slow
def test_one_capture_and_one_plan_serve_the_audit_and_memory(counted):
    step = levers.Step("demo", params={"size": "tiny", "device": "cpu"})
    capture = step.capture(warmup=0, timed=1)
    audited = step.audit(target="h200", select=["MEM001", "NORM001"], benchmark=False)
    assert audited.capture is capture
    assert counted["capture"] == 1
    assert {f.code for f in audited.findings} <= {"MEM001", "NORM001"}
    assert "NORM001" in {f.code for f in audited.findings}
    # the audit's prediction (h200, with MEM001's what-ifs) is the plan step.memory returns
    plan = step.memory(gpu="h200", whatifs=True)
    assert counted["predict"] == 1
    assert audited.memory is not None and audited.memory.gpu == plan.gpu.name == "h200"
    assert audited.memory.peak_reserved_bytes == plan.peak_reserved_bytes
    assert step.memory(gpu="h200", whatifs=True) is plan
    assert step.capture(warmup=0, timed=1) is capture and counted["capture"] == 1


def test_audit_without_capture_captures_once_and_memory_model_can_be_off(counted):
    step = levers.Step("demo", params={"size": "tiny", "device": "cpu"})
    audited = step.audit(select=["SYNC001"], memory_model=False, benchmark=False)
    again = step.audit(select=["SYNC001"], memory_model=False, benchmark=False)
    assert audited.memory is None and counted["predict"] == 0
    assert again.capture is audited.capture and counted["capture"] == 1


def test_a_bad_spec_is_refused_at_once():
    with pytest.raises(WorkloadNotFound, match="nope"):
        Step("nope")
    with pytest.raises(TypeError, match="workload spec"):
        Step(42)


def test_a_built_workload_captures_but_does_not_predict_or_ab():
    step = Step(levers.Step("demo", params={"size": "tiny", "device": "cpu"}).workload())
    with pytest.raises(TypeError, match="fake tensors"):
        step.memory(gpu="h100")
    with pytest.raises(TypeError, match="workload spec"):
        step.ab("fused-optimizer")
    with pytest.raises(TypeError, match="params"):
        Step(step.workload(), params={"size": "tiny"})


def test_candidate_or_levers():
    assert _candidate_and_levers(None) == (None, [])
    assert _candidate_and_levers("fused-optimizer,ac-budget:budget=1GiB") == (
        None, ["fused-optimizer", "ac-budget:budget=1GiB"],
    )
    assert _candidate_and_levers(["rms-norm-fused"]) == (None, ["rms-norm-fused"])
    assert _candidate_and_levers("demo") == ("demo", [])
    assert _candidate_and_levers("train.py:build") == ("train.py:build", [])


def test_ab_returns_the_result_of_the_same_design_as_levers_ab():
    step = Step(f"{AB_FACTORIES}:build")
    result = step.ab(params_b={"fixed": "rewrite"}, steps=4, warmup=1, parity_steps=2,
                     resamples=200)
    assert result.config.exactness == "changes-numerics"
    assert (result.config.num_steps, result.config.num_resamples) == (4, 200)
    assert result.candidate.params["fixed"] == "rewrite"
    assert result.parity is not None and result.parity.passed


# ---- every verb goes through levers.Step, whose methods say what they return -----------------


def test_each_method_declares_its_real_return_type():
    import typing

    from levers.ab.runner import AbResult
    from levers.audit.run import AuditedStep
    from levers.capture.records import Capture
    from levers.memory.plan import FitPoint, FitResult, Measured, MemoryPlan
    from levers.tune.result import TuneResult
    from levers.workload import Workload

    expected = {
        "workload": Workload, "capture": Capture, "memory": MemoryPlan, "fit": FitResult,
        "measure_memory": Measured, "audit": AuditedStep, "ab": typing.Optional[AbResult],
        "tune": TuneResult, "from_capture": Step,
    }
    # the analyses' types are imported for type checking only (levers.api stays light)
    names = {t.__name__: t for t in (AbResult, AuditedStep, Capture, FitResult, Measured,
                                     MemoryPlan, TuneResult, FitPoint)}
    hints = {
        name: typing.get_type_hints(getattr(Step, name), localns=names)["return"]
        for name in expected
    }
    assert hints == expected


def test_a_step_of_a_capture_made_elsewhere_audits_it_and_refuses_to_rebuild():
    captured = levers.Step("demo", params={"size": "tiny", "device": "cpu"}).capture(
        warmup=0, timed=0
    )
    step = Step.from_capture(captured)
    audited = step.audit(select=["SYNC001"], benchmark=False)
    assert audited.capture is captured and audited.memory is None
    with pytest.raises(TypeError, match="Step.memory needs to build the workload itself"):
        step.memory()
    with pytest.raises(TypeError, match="Step.ab builds each side from the workload spec"):
        step.ab()


def _calls_of(monkeypatch, name: str) -> list:
    calls: list = []
    real = getattr(Step, name)

    def counted(self, *args, **kwargs):
        calls.append(kwargs)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Step, name, counted)
    return calls


def test_levers_memory_goes_through_step_memory_and_step_fit(monkeypatch, capsys):
    from levers.cli import main

    memory, fit = _calls_of(monkeypatch, "memory"), _calls_of(monkeypatch, "fit")
    spec = f"{Path(__file__).parent / 'memory' / 'memory_factories.py'}:mlp"
    argv = ["memory", spec, "--gpu", "0.6GiB", "--fit", "--no-whatifs", "--predict-steps", "1"]
    assert main(argv) == 0, capsys.readouterr().err
    # the command builds the options record once and passes it whole to both
    options = [c["options"] for c in memory]
    assert [(o.gpu.name, o.num_steps, o.whatifs) for o in options] == [("0.6GiB", 1, False)]
    assert [c["options"] for c in fit] == options


def test_levers_ab_goes_through_step_ab(monkeypatch, capsys):
    from levers.cli import main

    ab = _calls_of(monkeypatch, "ab")
    quick = ["--steps", "3", "--warmup", "0", "--parity-steps", "1", "--resamples", "100"]
    assert main(["ab", f"{AB_FACTORIES}:build", "--set-b", "fixed=rewrite", *quick]) == 0
    capsys.readouterr()
    assert [(c["params_b"], c["steps"], c["resamples"]) for c in ab] == [
        ({"fixed": "rewrite"}, 3, 100)
    ]
