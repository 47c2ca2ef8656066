"""cuDNN attention's backward memory on an H200, predicted on fake tensors, against the probe
that measured it (torch 2.11, cuDNN 9.19: ``attention_memory`` in
``bench/results/memory_calibration_h200/memory_calibration.json``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from levers.hardware import resolve_gpu
from levers.memory.fake import trace_workload
from levers.memory.replay import replay
from levers.workload import Workload

CALIBRATION = (
    Path(__file__).parents[2]
    / "bench"
    / "results"
    / "memory_calibration_h200"
    / "memory_calibration.json"
)
CUDNN_ROWS = [
    row
    for row in json.loads(CALIBRATION.read_text())["attention_memory"]
    if row[0] == "SDPBackend.CUDNN_ATTENTION"
]


def probe_workload(batch, heads, kv_heads, q_len, k_len, head_dim, causal, kept: list):
    def factory(device: str = "cuda") -> Workload:
        model = torch.nn.Linear(1, 1).to(device)

        def step() -> None:
            def make(h: int, length: int) -> torch.Tensor:
                return torch.randn(
                    batch, h, length, head_dim, device=device, dtype=torch.bfloat16,
                    requires_grad=True,
                )  # fmt: skip

            q, k, v = make(heads, q_len), make(kv_heads, k_len), make(kv_heads, k_len)
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                out = F.scaled_dot_product_attention(
                    q, k, v, is_causal=causal, enable_gqa=heads != kv_heads
                )
            grad = torch.ones_like(out)
            out.backward(grad)
            kept.extend([q, k, v, out, grad])  # alive after the step, as in the probe

        return Workload(model=model, step=step)

    return factory


@pytest.mark.parametrize("row", CUDNN_ROWS, ids=lambda row: "x".join(map(str, row[1:7])))
def test_cudnn_backward_memory_matches_the_h200_probe(row):
    shape, measured = row[1:8], row[8:12]
    _, _, measured_after, measured_peak = measured
    kept: list = []
    trace, _ = trace_workload(probe_workload(*shape, kept), resolve_gpu("h200"), num_steps=1)
    curve = replay(trace).allocated_curve
    start = trace.backward_starts[0]
    base = curve[start - 1]
    assert {call.backend for call in trace.sdpa_calls} == {"cudnn"}
    assert max(curve[start:]) - base == measured_peak
    assert curve[-1] - base == measured_after
