"""levers tune and the measured claims on a GPU: real A/Bs of the demo on CUDA."""

from __future__ import annotations

import json

import pytest
import torch

import levers

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

PARAMS = {"size": "tiny", "device": "cuda"}


def test_tune_on_the_gpu_returns_a_proven_stack_or_nothing(tmp_path):
    record = tmp_path / "tune.record.jsonl"
    result = levers.Step("demo", params=PARAMS).tune(
        budget="4m", steps=20, warmup=3, record=record, exclude="compile-blocks"
    )
    assert result.device.startswith("cuda")
    # the GPU levers are candidates on a GPU
    reasons = {o.lever: o.reason for o in result.outcomes}
    assert not reasons["rms-norm-fused"].startswith("its speed-up exists only on a GPU")
    if result.stack:
        assert result.proof.base == () and result.proof.tokens_per_s_ci95[0] > 1.0
        assert result.proof.peak_allocated_bytes is not None  # measured on a GPU
    events = [json.loads(line) for line in record.read_text().splitlines()]
    assert events[-1]["event"] == "tune-result"
    print(json.dumps(result.to_dict(), default=str)[:4000])


def test_the_audit_measures_its_claims_on_a_gpu_capture():
    step = levers.Step("demo", params=PARAMS)
    audited = step.audit(memory_model=False)
    claims = audited.claims
    assert claims is not None, "a GPU capture of a spec measures the recommended levers"
    for claim in claims.claims:
        assert claim.trial.ab is not None or claim.trial.error
        print(claim.lever, claim.codes, f"claimed {claim.claimed_ms:.3f} ms",
              f"measured {claim.measured_ms} ms", claim.why)
    rec = audited.result.recommendation
    assert rec.provenance == ("proven" if claims.proven else "estimated")
    for finding in audited.findings:
        measured = finding.details.get("measured")
        if measured and not measured["pays"]:
            assert finding.details["recommended"] is False
            assert "Measured on this step" in finding.message


def test_a_target_keeps_the_estimates_on_a_gpu_capture():
    audited = levers.Step("demo", params=PARAMS).audit(memory_model=False, target="h100")
    assert audited.claims is None
    assert audited.result.recommendation.provenance == "estimated"


def test_a_compiled_trial_of_a_dropout_model_with_cuda_graphs_is_timed_as_the_user_runs_it():
    # compile-model picks CUDA graphs on a GPU. Its parity steps compile the program with random
    # numbers drawn as eager draws them; a program replayed as CUDA graphs so compiled does not
    # time as the user's (luke, H100, s54), so where time allows (this trial has no budget) the
    # side compiles again for its timed steps (76534c0) and says its timed steps ran as the user's
    from pathlib import Path

    from torch._dynamo.utils import counters

    from levers.ab.verdict import PARITY
    from levers.tune.measure import TrialDesign, ab_measure

    torch._dynamo.reset()
    before = counters["stats"]["unique_graphs"]
    spec = f"{Path(__file__).parent / 'dropout_factory.py'}:build"
    design = TrialDesign(steps=10, warmup=2, parity_steps=2, resamples=500)
    trial = ab_measure(spec, {"dim": 256, "batch_size": 64, "device": "cuda"}, design)(
        (), ("compile-model",), None
    )
    assert trial.error is None and trial.killed is None, (trial.error, trial.killed)
    assert trial.parity == PARITY, trial.parity_note
    assert trial.timed_eager_random is False
    assert counters["stats"]["unique_graphs"] - before == 2  # the parity steps', the user's
    assert trial.tokens_per_s_ratio is not None and trial.tokens_per_s_ratio > 0
