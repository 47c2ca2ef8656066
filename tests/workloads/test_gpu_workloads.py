"""The 1b built-in workloads on a GPU: each builds and runs a step with a finite loss.

Run on the device machine: ``python -m pytest -m gpu tests/workloads/test_gpu_workloads.py``.
"""

from __future__ import annotations

import gc
import math

import pytest
import torch

from levers.workloads import demo, llama

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.fixture(autouse=True)
def free_gpu_memory():
    yield
    gc.collect()
    torch.cuda.empty_cache()


@pytest.mark.parametrize("fixed", ["none", "all"])
def test_demo_1b_step(fixed):
    workload = demo.build(size="1b", device="cuda", fixed=fixed)
    num_params = sum(p.numel() for p in workload.model.parameters())
    assert 0.9e9 < num_params < 1.3e9
    loss = workload.step()
    assert loss.device.type == "cuda"
    assert math.isfinite(loss.item())
    assert workload.model.metrics["peak_allocated_bytes"] > 0


def test_llama_1b_step():
    workload = llama.build(size="1b", device="cuda")
    loss = workload.step()
    assert loss.device.type == "cuda"
    assert math.isfinite(loss.item())
