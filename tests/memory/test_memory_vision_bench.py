"""The vision and convolution workloads of bench/memory_accuracy.py build and predict on a CPU
(tiny shapes), so that the GPU run of the benchmark does not fail on a typo."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from levers.memory import predict_memory

BENCH = Path(__file__).parents[2] / "bench"


def _bench_module():
    spec = importlib.util.spec_from_file_location("memory_accuracy", BENCH / "memory_accuracy.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("index", [0, 1])
def test_the_smoke_vision_configs_predict_on_the_cpu(index):
    bench = _bench_module()
    name, spec, params = bench.SMOKE_CONFIGS[index]
    plan = predict_memory(spec, "h200", params=params, num_steps=1)
    categories = {c.category: c.nbytes for c in plan.by_category}
    assert categories["parameters"] > 0 and categories["activations"] > 0, name
    assert all(spec.startswith(str(BENCH)) for _, spec, _ in bench.SMOKE_CONFIGS)
    assert {n for n, *_ in bench.CONFIGS} >= {"vit-b16-standin-b64", "vit-b16-timm-b64"}
