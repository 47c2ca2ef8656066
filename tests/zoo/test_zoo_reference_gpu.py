"""The float64 reference of every zoo model on a GPU: finite, so that the parity gate judges by it.

On an H200 the reference of every model with a fused AdamW was NaN after its first update (the
step count cast to float64, read as float32 by CUDA's fused kernel), and every GPU parity fell
back to the fixed tolerance. Run on the device machine: ``pytest tests/zoo -m gpu``.
"""

from __future__ import annotations

import math

import pytest
import torch

from levers.ab.reference import run_reference
from levers.workloads import zoo

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.mark.parametrize("name", zoo.names())
def test_the_float64_reference_of_a_zoo_model_is_finite_on_the_gpu(name):
    if zoo.MODELS[name].available() is not None:
        pytest.skip(zoo.MODELS[name].available())

    def build():
        torch.manual_seed(0)
        # the full shape's widths at two blocks and a small batch: the float64 run's memory and
        # time stay small, the kernels (fused AdamW, SDPA's math path in float64) are the same
        return zoo.build(model=name, size="full", device="cuda", layers=2, batch_size=2)

    reference, kill = run_reference(build, num_steps=3, seed=0)
    assert kill is None
    assert reference.available, reference.why_not
    assert all(v is not None and math.isfinite(v) for v in reference.losses)
    assert all(v is not None and math.isfinite(v) for v in reference.grad_norms)
