"""On a GPU: the prediction against the real allocator's peaks (run on the device machine)."""

from __future__ import annotations

import memory_factories as factories
import pytest
import torch

from levers.memory import predict_memory
from levers.hardware import gpu_from_device_name, resolve_gpu
from levers.memory.measure import measure_peaks
from levers.memory.prediction import source_of

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.mark.parametrize(
    "workload, params",
    [
        (factories.stack, {"batch_size": 2048, "width": 1024, "depth": 4}),
        ("llama", {"size": "tiny"}),
    ],
)
def test_prediction_is_within_3_and_5_percent_of_the_measured_peaks(workload, params):
    gpu = gpu_from_device_name(torch.cuda.get_device_name()) or resolve_gpu("h100-80gb")
    plan = predict_memory(workload, gpu, params=params, num_steps=3)
    measured = measure_peaks(source_of(workload, params), num_steps=3)
    allocated_error = abs(plan.peak_allocated_bytes - measured.peak_allocated_bytes)
    reserved_error = abs(plan.peak_reserved_bytes - measured.peak_reserved_bytes)
    assert allocated_error <= 0.03 * measured.peak_allocated_bytes, (
        plan.peak_allocated_bytes,
        measured,
    )
    assert reserved_error <= 0.05 * measured.peak_reserved_bytes, (
        plan.peak_reserved_bytes,
        measured,
    )
