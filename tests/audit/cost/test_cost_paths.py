"""The cost model on a CPU: roofline figures, the ranking, and the measured path (microbenchmarks
and device time) exercised with the benchmark device switched to the CPU."""

from __future__ import annotations

import dataclasses

import pytest
from audit_helpers import captured, relabel_as_gpu

from levers.audit.options import AuditOptions
from levers.audit.config import make_config
from levers.audit.cost import microbench as mb
from levers.hardware import GPUS
from levers.audit.cost.price import price
from levers.audit.cost.roofline import KERNEL_OVERHEAD_US, part_us
from levers.audit.finding import Cost, Finding, Part, Receipt
from levers.audit.rank import payoff, rank
from levers.audit.rules.registry import all_rules


def test_roofline_of_a_large_bf16_matmul_is_compute_bound():
    part = Part("mm", flops=10**12, bytes=10**6, num_kernels=1, dtype="bfloat16")
    expected_us = 10**12 / (989.4e12 * 0.7) * 1e6 + KERNEL_OVERHEAD_US
    assert part_us(part, GPUS["h100-80gb"]) == pytest.approx(expected_us)


def test_roofline_of_a_copy_is_bandwidth_bound_and_h200_is_faster():
    part = Part("copy", bytes=4 * 10**9, num_kernels=1)
    h100, h200 = part_us(part, GPUS["h100-80gb"]), part_us(part, GPUS["h200"])
    assert h100 == pytest.approx(4e9 / (3350e9 * 0.8) * 1e6 + KERNEL_OVERHEAD_US)
    assert h200 < h100


def _finding(
    saved_ms: float, saved_bytes: int, code: str = "X001", severity: str = "low"
) -> Finding:
    return Finding(
        code=code,
        name="x",
        message="",
        fix_title="",
        severity=severity,
        effort="S",
        risk="low",
        receipts=(Receipt("f.py", 1, ""),),
        cost=Cost("estimated", now_ms=saved_ms, fixed_ms=0.0, saved_bytes=saved_bytes),
    )


def test_rank_by_time_share_plus_half_the_memory_share():
    fast = _finding(10.0, 0, "A001")  # 10% of a 100 ms step
    big = _finding(0.0, 300, "B001")  # 30% of a 1000-byte peak -> 15% with weight 0.5
    small = _finding(1.0, 0, "C001", severity="high")
    assert payoff(big, step_ms=100, peak_bytes=1000) == pytest.approx(0.15)
    assert [f.code for f in rank([small, fast, big], step_ms=100, peak_bytes=1000)] == [
        "B001",
        "A001",
        "C001",
    ]


@pytest.fixture
def cpu_bench(monkeypatch):
    monkeypatch.setattr(mb, "DEVICE", "cpu")


SPEC = {
    "query": {"shape": [1, 4, 8, 16], "dtype": "float32"},
    "key": {"shape": [1, 2, 8, 16], "dtype": "float32"},
    "value": {"shape": [1, 2, 8, 16], "dtype": "float32"},
    "attn_mask": {"shape": [1, 1, 8, 8], "dtype": "float32"},
    "enable_gqa": True,
    "requires_grad": True,
}


def test_sdpa_bench_runs_math_and_reports_missing_backends(cpu_bench):
    t = mb.bench_sdpa(SPEC, "MATH", warmup=1, samples=3, iters=1)
    assert t.ok and t.samples == 3 and t.min_us <= t.median_us <= t.max_us
    cudnn = mb.bench_sdpa(SPEC, "CUDNN_ATTENTION", warmup=1, samples=3, iters=1)
    assert not cudnn.ok and cudnn.unavailable.startswith("CUDNN_ATTENTION: ")
    missing = mb.bench_sdpa(SPEC, "NO_SUCH_BACKEND", warmup=1, samples=3, iters=1)
    assert (
        missing.unavailable
        == "NO_SUCH_BACKEND: SDPBackend.NO_SUCH_BACKEND does not exist in torch "
        + mb.torch.__version__
    )


def test_norm_benches_run(cpu_bench):
    assert mb.bench_rms_norm([2, 8, 32], "float32", warmup=1, samples=2, iters=1).ok
    assert mb.bench_layer_norm([2, 8, 32], "float32", warmup=1, samples=2, iters=1).ok


def _as_gpu_capture(code: str, case: str, device_us: float = 1.0):
    capture, scopes = captured(code, case)
    capture = relabel_as_gpu(capture)
    ops = tuple(dataclasses.replace(op, device_us=device_us) for op in capture.ops)
    return dataclasses.replace(capture, ops=ops), scopes


def _bf16_on_cuda(args):
    return {
        name: {**args[name], "device": "cuda:0", "dtype": "bfloat16"}
        for name in ("query", "key", "value")
    }


def test_measured_now_and_unavailable_backend_falls_back_to_the_estimate(cpu_bench):
    capture, scopes = _as_gpu_capture("ATTN001", "fire_pinned_mask_gqa")
    config = make_config(capture, AuditOptions.checked(torch_version="2.11"), scopes=scopes)
    assert config.on_gpu and config.gpu.family == "h100"
    findings = list(all_rules()["ATTN001"].check(capture, config))
    # a relabelled CPU capture ran the CPU kernel: the rule trusts backend_ran only when it is CUDA's
    assert findings == []
    capture = dataclasses.replace(
        capture,
        calls=tuple(
            dataclasses.replace(
                c, args={**c.args, "backend_ran": "MATH", **_bf16_on_cuda(c.args)}
            )
            if c.kind == "sdpa"
            else c
            for c in capture.calls
        ),
    )
    (finding,) = all_rules()["ATTN001"].check(capture, config)
    (priced,) = price([finding], capture, config)
    cost = priced.cost
    assert cost.provenance == "measured"
    assert cost.now_ms == pytest.approx(len(finding.work.now_ops) * 1e-3)
    assert cost.fixed_provenance == "estimated"
    assert "CUDNN_ATTENTION unavailable" in cost.basis


def test_measured_norm_fix_is_benchmarked(cpu_bench):
    capture, scopes = _as_gpu_capture("NORM001", "fire_rms_norm", device_us=5.0)
    config = make_config(capture, scopes=scopes)
    (finding,) = all_rules()["NORM001"].check(capture, config)
    (priced,) = price([finding], capture, config)
    assert priced.cost.provenance == "measured"
    assert priced.cost.fixed_provenance == "measured"
    assert "F.rms_norm at the same shapes" in priced.cost.basis
    assert priced.cost.per_call_now_ms == pytest.approx(priced.cost.now_ms / 3)


def test_measured_recompute_and_removed_copies(cpu_bench):
    capture, scopes = _as_gpu_capture(
        "MEM001", "fire_activations_dominate", device_us=2.0
    )
    config = make_config(capture, scopes=scopes)
    (finding,) = all_rules()["MEM001"].check(capture, config)
    (priced,) = price([finding], capture, config)
    assert priced.cost.now_ms == 0.0
    assert priced.cost.fixed_ms == pytest.approx(
        2.0e-3 * len(finding.work.fixed_extra_ops)
    )
    capture, scopes = _as_gpu_capture(
        "COPY001", "fire_clone_then_scatter", device_us=3.0
    )
    config = make_config(capture, scopes=scopes)
    (finding,) = all_rules()["COPY001"].check(capture, config)
    (priced,) = price([finding], capture, config)
    assert priced.cost.fixed_ms == 0.0 and "removes" in priced.cost.basis


def test_measured_loss_fix_is_benchmarked_over_the_valid_rows(cpu_bench):
    capture, scopes = _as_gpu_capture("LOSS001", "fire_half_ignored", device_us=4.0)
    config = make_config(capture, scopes=scopes)
    (finding,) = all_rules()["LOSS001"].check(capture, config)
    assert finding.work.bench == {
        "kind": "loss_rows",
        "rows": 32,
        "vocab": 128,
        "loss_dtype": "float32",
        "input_dtype": "float32",
        "head": {"hidden": 32, "dtype": "float32"},
    }
    (priced,) = price([finding], capture, config)
    assert priced.cost.provenance == "measured"
    assert priced.cost.fixed_provenance == "measured"
    assert "head matmul, cast and cross_entropy over the 32 rows" in priced.cost.basis
    # without benchmarks the fix falls back to the share of rows that remain, labelled estimated
    (unbenched,) = price([finding], capture, config, benchmark=False)
    assert unbenched.cost.fixed_provenance == "estimated"
    assert unbenched.cost.fixed_ms == pytest.approx(unbenched.cost.now_ms * 0.5)
