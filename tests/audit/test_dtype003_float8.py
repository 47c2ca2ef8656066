"""DTYPE003: which linears it counts (the float8 lever's filter, read from the capture), the GPU
it reads, the share of GPU time or of FLOPs, the saving marked estimated on a CPU and on a GPU
capture, the already-right item when float8 runs, and the lever reaching the audit's stack and
tune's candidates."""

import dataclasses

import pytest
from audit_helpers import BASE_CONFIG, captured, rule_config, run_rule

from levers.audit.options import AuditOptions
from levers.audit.config import make_config
from levers.audit.cost.price import price
from levers.audit.recommend import recommend
from levers.audit.report_format import cost_line
from levers.audit.rules.dtype003_bf16_matmul_on_float8_gpu import (
    MIN_FLOP_SHARE,
    MIN_TIME_SHARE,
    SAVED_FRACTION,
    already_right,
    check,
    linear_matmuls,
    step_gpu,
)
from levers.capture.records import Capture
from levers.tune.candidates import audit_expectations
from levers.vocab import ESTIMATED, MEASURED

CODE = "DTYPE003"


def _config(name: str, **kwargs):
    capture, scopes = captured(CODE, name)
    return capture, rule_config(capture, scopes, **{**BASE_CONFIG, **kwargs})


def _eligible_ops(capture: Capture, config) -> list:
    return [op for lin in linear_matmuls(capture, config) if not lin.why for op in lin.ops]


def test_the_filter_takes_the_large_projections_and_leaves_the_small_one_and_the_head():
    capture, config = _config("fire_cpu_h200", target="h200")
    why = {lin.path: lin.why for lin in linear_matmuls(capture, config)}
    assert why["gate"] == why["up"] == ""
    assert why["down"] == "too small to pay (K=2048, N=512; left when K <= 4096 and N <= 1024)"
    assert why["lm_head"].startswith("the output head (N=1024)")
    shapes = {lin.path: (lin.k, lin.n, lin.m, lin.dtype) for lin in linear_matmuls(capture, config)}
    assert shapes["gate"] == (512, 2048, 128, "bfloat16")
    # each linear's forward and the backward's two matmuls
    assert {lin.path: len(lin.ops) for lin in linear_matmuls(capture, config)}["up"] == 3


def test_a_bf16_step_for_an_h200_fires_with_the_flop_share_and_an_estimated_saving():
    [finding] = run_rule(CODE, "fire_cpu_h200")
    assert finding.lever == "float8" and finding.fix_safety == "changes-numerics"
    assert finding.details["share_of"] == "flops"
    assert finding.details["share"] >= MIN_FLOP_SHARE
    assert "of the step's FLOPs" in finding.message and "the share is of FLOPs" in finding.message
    # the saving is an estimate, and says so beside it
    assert "float8 would save an estimated" in finding.message
    assert finding.details["saving"] == ESTIMATED
    assert finding.cost.provenance == ESTIMATED
    assert finding.cost.saved_ms == pytest.approx(SAVED_FRACTION * finding.cost.now_ms)
    assert "1.04x over compile-blocks" in finding.message and "2.15x" in finding.message
    assert "pays only compiled" in finding.fix_title and "compile-blocks" in finding.fix_title
    modules = [r.module for r in finding.receipts]
    assert sorted(modules) == ["gate", "up"]
    assert all(r.shapes.startswith("K=512 N=2048 M=128 bfloat16") for r in finding.receipts)
    assert all(r.count == 3 for r in finding.receipts)
    # every matmul it would convert is narrow (512 by 2048): the measured loss there is named
    assert finding.details["narrow"] is True
    assert "smaller side of 512" in finding.message and "0.93-0.96x" in finding.message
    assert "levers tune does not try it here" in finding.message


def test_on_a_gpu_capture_the_share_is_of_gpu_time_and_only_the_fixed_side_is_estimated():
    capture, config = _config("fire_gpu_h200")
    assert config.on_gpu and step_gpu(capture, config) == ("NVIDIA H200", (9, 0))
    [finding] = price(list(check(capture, config)), capture, config, benchmark=False)
    eligible_us = sum(op.device_us for op in _eligible_ops(capture, config))
    assert finding.details["share_of"] == "gpu_time"
    assert finding.details["share"] == pytest.approx(eligible_us * 1e-6 / capture.timing.median_s)
    assert finding.details["share"] >= MIN_TIME_SHARE
    assert "of the step's GPU time" in finding.message
    cost = finding.cost
    assert (cost.provenance, cost.fixed_provenance) == (MEASURED, ESTIMATED)
    assert cost.now_ms == pytest.approx(eligible_us / 1e3)
    assert cost.saved_ms == pytest.approx(SAVED_FRACTION * eligible_us / 1e3)
    assert finding.details["estimated_saved_ms"] == pytest.approx(cost.saved_ms)
    assert "fixed (estimated)" in cost_line(finding)
    assert "float8 saves an estimated 7% of these matmuls' time" in cost.basis
    # levers tune reads the saving as an estimate, as it reads HOST001's
    share, source = audit_expectations([finding], step_ms=capture.timing.median_s * 1e3)["float8"]
    assert share == pytest.approx(cost.saved_ms / (capture.timing.median_s * 1e3))
    assert source == f"audit DTYPE003: {cost.saved_ms:.3g} ms estimated"


def test_the_gpu_time_share_decides_on_a_gpu_capture():
    capture, config = _config("ok_gpu_small_share")
    eligible_us = sum(op.device_us for op in _eligible_ops(capture, config))
    # the same linears as the firing case: their share of the step is what keeps it quiet
    assert eligible_us * 1e-6 / capture.timing.median_s < MIN_TIME_SHARE
    assert list(check(capture, config)) == []


def test_the_recorded_capability_decides_not_the_target():
    capture, config = _config("fire_gpu_the_table_lacks", target="a100")
    assert config.gpu.sm == (8, 0)  # levers' table lacks the L40S: the target stands in
    assert step_gpu(capture, config) == ("NVIDIA L40S", (8, 9))
    assert len(list(check(capture, config))) == 1
    # a CPU capture for an A100, and a GPU capture on one, do not fire
    capture, config = _config("ok_cpu_a100", target="a100")
    assert step_gpu(capture, config)[1] == (8, 0)
    capture, config = _config("ok_gpu_a100")
    assert step_gpu(capture, config) == ("NVIDIA A100-SXM4-80GB", (8, 0))


def test_small_linears_and_a_head_alone_do_not_fire():
    capture, config = _config("ok_small_linears", target="h200")
    assert all(
        lin.why.startswith(("too small", "the output head"))
        for lin in linear_matmuls(capture, config)
    )
    capture, config = _config("ok_head_only", target="h200")
    [head] = linear_matmuls(capture, config)
    # named decoder: the head is found by its N, the embedding's rows
    assert head.path == "decoder" and head.why.startswith("the output head (N=8192)")
    assert run_rule(CODE, "ok_head_only") == []


def test_fp32_matmuls_on_a_gpu_are_dtype001_s():
    capture, config = _config("ok_fp32_on_gpu")
    whys = {lin.path: lin.why for lin in linear_matmuls(capture, config)}
    assert whys["gate"] == "runs in float32, not bf16/fp16"


def test_float8_already_running_is_already_right():
    pytest.importorskip("torchao.float8")
    capture, config = _config("ok_float8_already")
    assert capture.modules["gate"] == "Float8Linear"
    assert list(check(capture, config)) == []
    right = already_right(capture, config)
    assert right.code == CODE and right.title == "float8 matmuls"
    # torchao's matmuls read as bf16 mm on its float8 subclass: its casts to float8 show it
    assert right.detail.startswith("2 Float8Linear modules; ")
    assert "ops on float8 tensors per step" in right.detail
    assert right.detail.endswith("(first in gate)")
    # the bf16 step does not show it
    capture, config = _config("fire_gpu_h200")
    assert already_right(capture, config) is None


def test_a_compiled_step_is_told_to_convert_before_its_compile():
    capture, config = _config("fire_cpu_h200", target="h200")
    compiled = dataclasses.replace(
        capture, settings={**capture.settings, "compile": {"frames_compiled": 1}}
    )
    [finding] = check(compiled, config)
    assert finding.details["compiled"] is True
    assert "before the step's torch.compile" in finding.fix_title


def test_the_audit_stacks_float8_on_a_gpu_and_names_why_not_on_a_cpu():
    capture, config = _config("fire_gpu_h200")
    findings = price(list(check(capture, config)), capture, config, benchmark=False)
    rec = recommend(findings, capture, step_ms=1.0, weight=0.0, workload_spec="w.py:f",
                    implemented=frozenset({"float8"}))
    assert (rec.levers, rec.codes) == (("float8",), (CODE,))
    cpu = run_rule(CODE, "fire_cpu_h200")
    capture, _ = captured(CODE, "fire_cpu_h200")
    rec = recommend(cpu, capture, step_ms=1.0, weight=0.0, workload_spec="w.py:f",
                    implemented=frozenset({"float8"}), on_gpu=False, gpu="h200")
    assert rec.levers == ()
    assert any(n.startswith("DTYPE003: float8 left out: it needs a CUDA GPU") for n in rec.notes)


def test_the_filter_agrees_with_the_float8_lever_s_plan():
    """The capture's view of a llama's linears: the same set the lever converts (its MLP
    up-projections, K=128 and N=2048; not q/k/v, out, down or the head)."""
    ao = pytest.importorskip("torchao.float8")
    import torch

    from levers import Workload
    from levers.capture import capture_step
    from levers.levers import float8
    from levers.workloads import _runtime, llama

    cfg = dataclasses.replace(llama.SIZES["tiny"], width=128, ffn=1024, heads=4, kv_heads=4)
    with _runtime.seeded(0, torch.device("cpu")):
        model = llama.LlamaLM(cfg)
    optimizer = _runtime.adamw(model, lr=llama.LEARNING_RATE)
    step = llama.training_step(
        model, optimizer, cfg, _runtime.data_generator(0, torch.device("cpu"))
    )
    plan = float8.plan(
        model, "tensorwise", ao._auto_filter_for_recipe("tensorwise", filter_fqns=[])
    )
    capture = capture_step(Workload(model=model, step=step, optimizer=optimizer), warmup=0, timed=0)
    # a float32 CPU step: computed in bf16 on the GPU (the audit's default assumption)
    config = make_config(capture, AuditOptions.checked(gpu="h200"))
    seen = {lin.path: lin.why == "" for lin in linear_matmuls(capture, config)}
    assert seen == {c.path: c.converts for c in plan}
    assert any(seen.values()) and not all(seen.values())
