"""MEM001's headroom from the memory model: the plan-to-input conversion, the fallbacks, and
``levers audit`` running ``levers.memory.predict_memory`` (or not) for it."""

from __future__ import annotations

import dataclasses

import pytest
from audit_helpers import BASE_CONFIG, captured, rule_config

from levers.audit.options import AuditOptions
import levers.memory
from levers.cli import main
from levers.audit.config import (
    PredictedMemory,
    make_config,
    predicted_memory_from_plan,
)
from levers.audit.rules.registry import all_rules
from levers.hardware import GPUS
from levers.memory.options import MemoryOptions
from levers.memory.plan import CategoryBytes, MemoryPlan, PeakMoment, WhatIf
from levers.audit.run import memory_gpu

MIB = 1 << 20
QUICK = ["--warmup", "0", "--timed", "1"]
CHECKPOINTING = WhatIf(
    name="activation-checkpointing",
    description="every block under torch.utils.checkpoint (non-reentrant)",
    method="re-prediction with 4 blocks wrapped",
    applicable=True,
    peak_allocated_bytes=7 * MIB,
    peak_reserved_bytes=20 * MIB,
    delta_allocated_bytes=-MIB,
    delta_reserved_bytes=-2 * MIB,
)
BF16_STATES = WhatIf(
    "bf16-optimizer-states",
    "optimizer state in bfloat16",
    "trace transform",
    True,
    0,
    0,
    -5,
    -5,
)


def hand_made_plan(whatifs: tuple[WhatIf, ...]) -> MemoryPlan:
    return MemoryPlan(
        workload="mem001",
        params={},
        gpu=GPUS["h200"],
        num_steps=3,
        peak_allocated_bytes=8 * MIB,
        peak_reserved_bytes=22 * MIB,
        usable_bytes=GPUS["h200"].usable_bytes,
        margin=0.05,
        fits=True,
        num_parameters=1000,
        by_category=(
            CategoryBytes("activations", 3 * MIB),
            CategoryBytes("parameters", 2 * MIB),
        ),
        activations_by_module=(),
        peak=PeakMoment("backward", 2, "blocks.3", "aten.mm", None, 10),
        live_at_peak=(),
        timeline=(),
        around_peak=(),
        attention=(),
        assumptions=(),
        whatifs=whatifs,
    )


def test_a_plan_gives_mem001_its_numbers():
    memory = predicted_memory_from_plan(hand_made_plan((BF16_STATES, CHECKPOINTING)))
    assert memory == PredictedMemory(
        gpu="h200",
        usable_bytes=GPUS["h200"].usable_bytes,
        num_steps=3,
        peak_allocated_bytes=8 * MIB,
        peak_reserved_bytes=22 * MIB,
        activation_bytes=3 * MIB,
        checkpointing_applicable=True,
        checkpointing_delta_allocated_bytes=-MIB,
        checkpointing_delta_reserved_bytes=-2 * MIB,
        checkpointing_note="re-prediction with 4 blocks wrapped",
        # the bf16-state what-if's allocated change, MEM004's
        bf16_state_delta_allocated_bytes=-5,
    )


def test_a_failed_or_missing_whatif_reads_as_not_applicable():
    failed = dataclasses.replace(
        CHECKPOINTING,
        applicable=False,
        delta_allocated_bytes=0,
        delta_reserved_bytes=0,
        note="failed: boom",
    )
    memory = predicted_memory_from_plan(hand_made_plan((failed,)))
    assert (memory.checkpointing_applicable, memory.checkpointing_note) == (
        False,
        "failed: boom",
    )
    memory = predicted_memory_from_plan(hand_made_plan(()))
    assert memory.checkpointing_applicable is False
    assert memory.checkpointing_delta_allocated_bytes == 0
    assert memory.checkpointing_note == "the plan was predicted without what-ifs"


def mem001(memory: PredictedMemory | None):
    capture, scopes = captured("MEM001", "fire_activations_dominate")
    config = rule_config(capture, scopes, memory=memory, **BASE_CONFIG)
    return list(all_rules()["MEM001"].check(capture, config))


def memory_bound(memory: PredictedMemory) -> PredictedMemory:
    """The prediction on a GPU only 1 MiB larger than its reserved peak: memory binds."""
    return dataclasses.replace(memory, usable_bytes=memory.peak_reserved_bytes + MIB)


def test_the_plan_converted_from_a_memory_plan_drives_the_headroom():
    (finding,) = mem001(memory_bound(predicted_memory_from_plan(hand_made_plan((CHECKPOINTING,)))))
    assert finding.details["recommended"] is True and finding.details["bound"] == "memory-bound"
    assert finding.details["headroom_source"] == "levers memory"
    assert finding.work.saved_bytes == MIB
    # 1 MiB is at least a tenth of the 8 MiB predicted allocated peak
    assert finding.severity == "high"
    assert (
        "lower the allocated peak by 1.00 MiB (12%, from 8.00 MiB)" in finding.message
    )
    assert "reserved peak by 2.00 MiB (to 20.0 MiB of 23.0 MiB usable" in finding.message
    assert "predicted by levers memory for h200" in finding.message
    assert finding.details["predicted"]["gpu"] == "h200"
    larger = dataclasses.replace(
        hand_made_plan((CHECKPOINTING,)), peak_allocated_bytes=16 * MIB
    )
    (finding,) = mem001(memory_bound(predicted_memory_from_plan(larger)))
    assert finding.severity == "medium"  # 1 MiB of 16 MiB


def test_throughput_bound_checkpointing_is_not_recommended_with_the_numbers():
    # the same prediction on the whole H200: 20 MiB reserved of 140 GiB
    (finding,) = mem001(predicted_memory_from_plan(hand_made_plan((CHECKPOINTING,))))
    assert finding.details["bound"] == "throughput-bound"
    assert finding.details["recommended"] is False and finding.severity == "low"
    assert finding.details["recompute_ms"] > 0
    assert "Not recommended: the step is throughput-bound" in finding.message
    assert "Keep the activations: the memory is free anyway." in finding.message


def test_without_a_plan_the_timeline_estimate_is_labelled():
    (finding,) = mem001(None)
    assert finding.details["headroom_source"] == "capture timeline"
    assert finding.details["predicted"] is None
    assert finding.work.saved_bytes == finding.details["timeline_headroom_bytes"] > 0
    assert (
        "a timeline estimate from the capture (no memory-model prediction)"
        in finding.message
    )


def test_a_prediction_without_activations_falls_back_to_the_timeline():
    # what a factory that builds on the CPU gives: nothing of the step on the stand-in GPU
    memory = PredictedMemory(
        gpu="h100-80gb",
        usable_bytes=GPUS["h100-80gb"].usable_bytes,
        num_steps=3,
        peak_allocated_bytes=65 * MIB,
        peak_reserved_bytes=66 * MIB,
        activation_bytes=0,
        checkpointing_applicable=True,
        checkpointing_delta_allocated_bytes=MIB,
        checkpointing_note="re-prediction with 4 blocks wrapped",
    )
    (finding,) = mem001(memory)
    assert finding.details["headroom_source"] == "capture timeline"
    assert (
        "levers memory predicts no activations live at its 65.0 MiB allocated peak on "
        "h100-80gb" in finding.message
    )


@pytest.mark.parametrize(
    "target, device_name, expected",
    [
        (None, None, "h100-80gb"),
        ("h100", None, "h100-80gb"),
        ("h200", None, "h200"),
        ("a100", None, "a100-80gb"),
        ("h100", "NVIDIA H200", "h200"),
        (None, "NVIDIA A100-SXM4-40GB", "a100-40gb"),
        ("a100", "Some Other GPU", "a100-80gb"),
    ],
)
def test_the_memory_models_gpu(target, device_name, expected):
    capture, _ = captured("MEM001", "fire_activations_dominate")
    if device_name is not None:
        env = {**capture.env, "device": "cuda:0", "device_name": device_name}
        capture = dataclasses.replace(capture, env=env)
    assert memory_gpu(target, capture) == expected


# --- levers audit ----------------------------------------------------------------------------


def audit(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["audit", "llama", *QUICK, "--select", "MEM001", *argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def calls(monkeypatch):
    """The predict_memory calls the audit makes (the real prediction runs)."""
    made = []
    real = levers.memory.predict_memory

    def spy(spec, **kwargs):
        made.append((spec, kwargs))
        return real(spec, **kwargs)

    monkeypatch.setattr(levers.memory, "predict_memory", spy)
    return made


def test_audit_takes_mem001s_headroom_from_the_memory_model(capsys, calls):
    code, out, err = audit(
        capsys, "--target", "h200", "--set", "device=cpu", "batch_size=3"
    )
    assert code == 0, err
    # the GPU run is predicted: the device the audit ran on here is not passed on
    assert calls == [
        ("llama", {"params": {"batch_size": 3}, "transform": None,
                   "options": MemoryOptions(gpu=GPUS["h200"], whatifs=True)})
    ]
    assert "MEM001 activations-without-checkpointing" in out
    assert "predicted by levers memory for h200" in " ".join(out.split())
    assert "warning" not in err


def test_no_memory_model_and_unselected_memory_rules_skip_the_prediction(capsys, calls):
    code, out, _ = audit(capsys, "--no-memory-model")
    assert code == 0
    assert calls == []
    assert (
        "a timeline estimate from the capture (no memory-model prediction)"
        in " ".join(out.split())
    )
    # without MEM001, ATTN002 and MEM004 the step is still predicted, for the bound, but without
    # the what-ifs; ATTN002 alone asks for them (the memory its fix frees)
    code = main(["audit", "llama", *QUICK, "--ignore", "MEM001,ATTN002,MEM004"])
    capsys.readouterr()
    assert code == 0 and [kwargs["options"].whatifs for _, kwargs in calls] == [False]
    code = main(["audit", "llama", *QUICK, "--select", "ATTN002"])
    capsys.readouterr()
    assert code == 0 and [kwargs["options"].whatifs for _, kwargs in calls] == [False, True]


def test_a_failing_prediction_warns_in_one_line_and_the_audit_goes_on(
    capsys, monkeypatch
):
    def fails(spec, **kwargs):
        raise RuntimeError("the model broke\nsecond line of the traceback text")

    monkeypatch.setattr(levers.memory, "predict_memory", fails)
    code, out, err = audit(capsys)
    assert code == 0
    warnings = [line for line in err.splitlines() if "warning" in line]
    assert warnings == [
        (
            "warning: levers memory could not predict the step (RuntimeError: the model broke); "
            "the bound is unknown and MEM001 estimates its headroom from the capture"
        )
    ]
    assert "MEM001 activations-without-checkpointing" in out
    assert "no memory-model prediction" in " ".join(out.split())
