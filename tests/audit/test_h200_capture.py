"""The rules on a real GPU capture: ``levers audit demo --set device=cuda size=1b`` recorded on an
H200 (torch 2.11, committed under bench/results/gpu_h200). Costs come from the recorded device
time; fixes are not benchmarked here (no GPU), so their figures are estimates and say so."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from levers.audit.options import AuditOptions
from levers.capture.records import Capture
from levers.audit import audit

CAPTURE = (
    Path(__file__).parents[2]
    / "bench"
    / "results"
    / "gpu_h200"
    / "demo_1b_capture.json.gz"
)


@pytest.fixture(scope="module")
def result():
    if not CAPTURE.exists():
        pytest.skip(f"{CAPTURE} is not in this checkout")
    with gzip.open(CAPTURE) as f:
        capture = Capture.from_dict(json.load(f))
    return capture, audit(capture, AuditOptions.checked(benchmark=False))


def by_code(result):
    found = {}
    for f in result[1].findings:
        found.setdefault(f.code, []).append(f)
    return found


def test_the_gpu_capture_is_audited_as_measured_on_an_h200(result):
    capture, res = result
    assert res.config.on_gpu and res.config.gpu.name == "h200"
    assert res.step_provenance == "measured"
    assert res.step_ms == pytest.approx(capture.timing.median_s * 1e3)


def test_the_eight_planted_inefficiencies_and_nothing_spurious(result):
    found = by_code(result)
    assert {
        "ATTN001",
        "ATTN002",
        "NORM001",
        "MEM001",
        "LOSS001",
        "SYNC001",
        "COPY001",
        "MEM002",
    } <= set(found)
    assert (
        "DTYPE001" not in found
    )  # MATH's internal fp32 matmuls are ATTN001's, not DTYPE001's
    assert "OPT001" not in found
    assert len(found["SYNC001"]) == 3
    receipts = {
        code: " ".join(r.code for f in fs for r in f.receipts)
        for code, fs in found.items()
    }
    assert "scaled_dot_product_attention" in receipts["ATTN001"]
    assert "einsum" in receipts["ATTN002"]
    assert "pow(2).mean" in receipts["NORM001"]
    assert ".clone()" in receipts["COPY001"]
    assert "max_memory_allocated" in receipts["MEM002"]
    assert "fused optimizer" in {a.title for a in result[1].already_right}


def test_costs_are_the_recorded_device_time_of_the_ops_named(result):
    capture, res = result
    for f in res.findings:
        # idle time (syncs, launch gaps) is no op's device time; a metric has no time cost
        if f.code in ("SYNC001", "HOST001", "MEM002"):
            continue
        assert f.cost.provenance == "measured", f.code
        expected = sum(capture.ops[i].device_us or 0.0 for i in f.work.now_ops) / 1e3
        assert f.cost.now_ms == pytest.approx(expected), f.code
    (attn,) = by_code(result)["ATTN001"]
    assert (
        attn.details["backend"] == "MATH"
        and attn.details["best_eligible"] == "CUDNN_ATTENTION"
    )
    assert attn.cost.calls_per_step == 8
    assert (
        attn.cost.fixed_provenance == "estimated"
        and "benchmarks off" in attn.cost.basis
    )


def test_the_launch_gaps_are_measured_and_the_demo_syncs_keep_cuda_graphs_off(result):
    capture, res = result
    (gaps,) = by_code(result)["HOST001"]
    assert gaps.details["num_kernels"] == len(capture.kernels) > 0
    assert 0.10 <= gaps.details["launch_and_idle_share"] < 1.0
    (reason,) = gaps.details["cuda_graph_reasons"]
    assert reason.startswith("4 host-device syncs per step")
    assert gaps.details["recommended"] is False and gaps.cost.saved_ms == 0.0
    assert gaps.lever is None
    assert gaps.cost.provenance == "estimated"
