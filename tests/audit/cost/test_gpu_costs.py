"""The measured-cost path on a GPU: microbenchmarks that run or say why not, and measured costs
on a GPU capture of small workloads. Skipped (visibly) without CUDA."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from levers import Workload
from levers.capture import capture_step
from levers.audit import audit
from levers.audit.cost import microbench as mb
from levers.audit.peak_metric_source import function_scope
from levers.loader import load_workload

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

SPEC = {
    "query": {"shape": [2, 8, 64, 64], "dtype": "bfloat16"},
    "key": {"shape": [2, 2, 128, 64], "dtype": "bfloat16"},
    "value": {"shape": [2, 2, 128, 64], "dtype": "bfloat16"},
    "attn_mask": {"shape": [1, 1, 64, 128], "dtype": "bfloat16"},
    "enable_gqa": True,
    "requires_grad": True,
}


@pytest.mark.parametrize(
    "backend",
    [
        "MATH",
        "CUDNN_ATTENTION",
        "FLASH_ATTENTION",
        "EFFICIENT_ATTENTION",
        "NO_SUCH_BACKEND",
    ],
)
def test_sdpa_bench_times_or_says_why_not(backend):
    t = mb.bench_sdpa(SPEC, backend, warmup=1, samples=3, iters=2)
    if t.ok:
        assert (
            t.median_us > 0 and t.min_us <= t.median_us <= t.max_us and t.samples == 3
        )
    else:
        assert t.median_us is None and t.unavailable.startswith(backend)
    if backend == "MATH":
        assert t.ok
    if backend in ("FLASH_ATTENTION", "NO_SUCH_BACKEND"):
        assert not t.ok  # a mask rules FLASH out: reported, not raised


def test_norm_benches_time():
    assert mb.bench_rms_norm([4, 128, 256], "float32", warmup=1, samples=3, iters=2).ok
    assert mb.bench_layer_norm(
        [4, 128, 256], "bfloat16", warmup=1, samples=3, iters=2
    ).ok


def _pinned_attention_workload() -> Workload:
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 3 * 64).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    x = torch.randn(2, 128, 64, device="cuda")
    mask = torch.zeros(1, 1, 128, 128, device="cuda", dtype=torch.bfloat16)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            q, k, v = model(x).view(2, 128, 3, 8, 8).permute(2, 0, 3, 1, 4)
            k, v = k[:, :2], v[:, :2]
            with sdpa_kernel(
                [
                    SDPBackend.FLASH_ATTENTION,
                    SDPBackend.EFFICIENT_ATTENTION,
                    SDPBackend.MATH,
                ]
            ):
                out = F.scaled_dot_product_attention(
                    q, k, v, attn_mask=mask, enable_gqa=True
                )
        out.float().pow(2).mean().backward()
        opt.step()
        opt.zero_grad()

    return Workload(model=model, step=step, optimizer=opt, name="gpu-attn")


def test_attn001_cost_is_measured_now_and_benchmarked_fixed():
    capture = capture_step(_pinned_attention_workload(), warmup=1, timed=2)
    result = audit(capture)
    findings = [f for f in result.findings if f.code == "ATTN001"]
    assert len(findings) == 1
    cost = findings[0].cost
    assert cost.provenance == "measured"
    assert cost.now_ms is not None and cost.now_ms > 0
    assert cost.fixed_provenance in ("measured", "estimated")
    if cost.fixed_provenance == "estimated":
        assert "unavailable" in cost.basis  # the benchmark said why
    assert cost.fixed_ms is not None
    assert "fused optimizer" in {a.title for a in result.already_right}


def test_demo_tiny_on_gpu_measures_every_priced_finding():
    workload = load_workload("demo", {"device": "cuda"})
    capture = capture_step(workload, warmup=1, timed=2)
    key, scope = function_scope(workload.step)
    result = audit(capture, scopes={key: scope})
    codes = {f.code for f in result.findings}
    assert {
        "ATTN001",
        "ATTN002",
        "NORM001",
        "SYNC001",
        "LOSS001",
        "COPY001",
        "MEM002",
    } <= codes
    for f in result.findings:
        assert f.cost is not None
        if f.code in ("SYNC001", "HOST001"):  # stalls and gaps: what a fix may recover, estimated
            assert f.cost.provenance == "estimated"
        elif f.code == "MEM002":
            assert f.cost.provenance == "none"
        else:
            assert f.cost.provenance == "measured", f.code
            assert f.cost.now_ms is not None
