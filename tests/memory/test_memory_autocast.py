"""CUDA's autocast lists applied to the stand-in tensors."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from levers.memory.fake import trace_workload
from levers.hardware import resolve_gpu
from levers.workload import Workload


def _workload(device: str = "cpu") -> Workload:
    model = torch.nn.Linear(32, 32, bias=False, device=device)
    seen = {}

    def step():
        x = torch.randn(4, 32, device=device)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            h = model(x)
            h2 = model(h)  # the same weight again: its bf16 copy is cached
            seen["mm"] = h2.dtype
            seen["softmax"] = torch.softmax(h2, -1).dtype
            seen["layer_norm"] = F.layer_norm(h2, (32,)).dtype
            seen["sum"] = h2.sum().dtype
        (h2.float().sum()).backward()

    workload = Workload(model=model, step=step)
    workload.params = {"seen": seen}
    return workload


def test_cuda_policy_per_op_and_the_weight_cast_cache():
    trace, workload = trace_workload(
        lambda: _workload("cuda"), resolve_gpu("h100-80gb"), num_steps=1
    )
    seen = workload.params["seen"]
    assert seen == {
        "mm": torch.bfloat16,  # lower precision
        "softmax": torch.float32,  # float32 (set_opt_dtype)
        "layer_norm": torch.float32,  # float32
        "sum": torch.float32,  # float32 (set_opt_dtype)
    }
    weight_casts = [
        a
        for a in trace.allocations
        if a.op == "aten._to_copy.default" and a.shape == (32, 32) and a.dtype == "bfloat16"
    ]
    assert len(weight_casts) == 1  # two uses of the weight in one region: one cast
