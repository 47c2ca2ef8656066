"""HOST001: silent on a CPU capture whose roofline gaps are large, the reasons CUDA graphs cannot
apply carried into the recommendation, and compile-model chosen from the finding by the audit's
stack and by tune's candidates."""

import dataclasses

from audit_helpers import BASE_CONFIG, captured, rule_config, run_rule

from levers.audit.options import AuditOptions
from levers.audit.bottleneck import LAUNCH, step_bottleneck
from levers.audit.config import make_config
from levers.audit.recommend import recommend
from levers.audit.rules.host001_launch_gaps import MIN_SHARE, busy_us, mean_gap_us
from levers.capture.records import KernelRecord
from levers.tune.candidates import audit_expectations


def _stack(findings, capture):
    return recommend(findings, capture, step_ms=1.0, weight=0.0, workload_spec="w.py:f",
                     implemented=frozenset({"compile-model"}))


def test_a_cpu_capture_with_a_large_estimated_gap_share_does_not_fire():
    capture, scopes = captured("HOST001", "ok_cpu_capture")
    config = rule_config(capture, scopes, **BASE_CONFIG)
    gaps = step_bottleneck(capture, config).of(LAUNCH)
    # the roofline's per-kernel overhead is most of this tiny step: over the threshold, unseen
    assert gaps.share >= MIN_SHARE
    assert run_rule("HOST001", "ok_cpu_capture") == []


def test_gaps_on_a_static_step_recommend_compile_model_and_tune_searches_it():
    [finding] = run_rule("HOST001", "fire_gaps")
    assert finding.lever == "compile-model" and finding.cost.provenance == "estimated"
    assert abs(finding.details["launch_and_idle_share"] - 0.16) < 1e-9
    assert finding.details["num_kernels"] == 21 and finding.details["cuda_graph_reasons"] == []
    assert abs(finding.cost.saved_ms - finding.details["launch_and_idle_ms"]) < 1e-12
    capture, _ = captured("HOST001", "fire_gaps")
    rec = _stack([finding], capture)
    assert (rec.levers, rec.codes) == (("compile-model",), ("HOST001",))
    expected = audit_expectations([finding], step_ms=finding.details["step_ms"])
    share, source = expected["compile-model"]
    assert abs(share - 0.16) < 1e-9 and source.startswith("audit HOST001")


def test_a_host_sync_is_a_reason_carried_into_the_recommendation():
    [finding] = run_rule("HOST001", "fire_with_sync")
    [reason] = finding.details["cuda_graph_reasons"]
    assert reason.startswith("1 host-device sync per step (the first at cases.py:")
    assert "CUDA graphs cannot apply now: 1 host-device sync" in finding.fix_title
    assert finding.details["recommended"] is False and finding.cost.saved_ms == 0.0
    assert finding.lever is None and "(compile-model, mode=reduce-overhead)" in finding.fix_title
    capture, _ = captured("HOST001", "fire_with_sync")
    assert _stack([finding], capture).levers == ()
    # no zero saving that would rank compile-model last in tune's search
    assert audit_expectations([finding], step_ms=finding.details["step_ms"]) == {}


def test_a_mixture_of_experts_is_graphed_in_part_and_a_size_recompile_is_a_reason():
    # inductor's CUDA graphs skip an MoE's routing and replay the rest: no reason that keeps
    # graphs off, the lever named with the mode to ask for, the gaps its estimate at most
    [moe] = run_rule("HOST001", "fire_moe")
    assert moe.details["cuda_graph_reasons"] == []
    assert moe.details["cuda_graphs_partly"].startswith("experts is a mixture of experts")
    assert moe.lever == "compile-model" and "recommended" not in moe.details
    assert moe.fix_title.startswith("Replay what CUDA graphs can capture: compile-model with "
                                    "mode=reduce-overhead asked by name (experts is a mixture")
    assert moe.cost.saved_ms > 0
    [resized] = run_rule("HOST001", "fire_dynamic_shapes")
    [reason] = resized.details["cuda_graph_reasons"]
    assert "size mismatch at index 0. expected 64, actual 48" in reason


def test_mean_gap_counts_idle_time_between_kernels_and_none_inside_overlaps():
    kernels = (
        KernelRecord("a", 10.0, 0, start_us=0.0),
        KernelRecord("b", 10.0, 1, start_us=5.0),  # overlaps a: no gap
        KernelRecord("c", 10.0, 2, start_us=25.0),  # 10 us after b ends
    )
    assert mean_gap_us(kernels) == 5.0
    assert mean_gap_us(tuple(dataclasses.replace(k, start_us=None) for k in kernels)) is None


def test_busy_time_counts_overlapping_kernels_once():
    kernels = (
        KernelRecord("a", 10.0, 0, start_us=0.0),
        KernelRecord("b", 10.0, 1, start_us=5.0),
        KernelRecord("c", 10.0, None, start_us=25.0),  # no op launched it: still busy
    )
    assert busy_us(kernels) == 25.0
    assert busy_us(tuple(dataclasses.replace(k, start_us=None) for k in kernels)) is None
