"""The vision, convolution and GPT-2 workloads of bench/memory_accuracy.py build and predict on
a CPU (tiny shapes), so that the GPU run of the benchmark does not fail on a typo."""

from __future__ import annotations

import pytest
from bench_module import BENCH, bench_module

from levers.memory import predict_memory
from optional_deps import needs


def _bench_module():
    return bench_module("memory_accuracy.py", "memory_accuracy")


@needs("transformers")
@pytest.mark.parametrize("index", [0, 1, 2])
def test_the_smoke_vision_configs_predict_on_the_cpu(index):
    bench = _bench_module()
    name, spec, params = bench.SMOKE_CONFIGS[index]
    plan = predict_memory(spec, "h200", params=params, num_steps=1)
    categories = {c.category: c.nbytes for c in plan.by_category}
    assert categories["parameters"] > 0 and categories["activations"] > 0, name
    assert all(spec.startswith(str(BENCH)) for _, spec, _ in bench.SMOKE_CONFIGS)
    assert {n for n, *_ in bench.CONFIGS} >= {"vit-b16-standin-b64", "vit-b16-timm-b64"}


def test_the_modelled_segments_add_up_to_the_reserved_peak():
    bench = _bench_module()
    name, spec, params = bench.SMOKE_CONFIGS[0]
    made = bench.predicted_segments(spec, params, "h200")
    plan = predict_memory(spec, "h200", params=params, num_steps=bench.NUM_STEPS)
    # no segment is released without a capacity, so the segments made are the reserved peak
    assert sum(row[0] for row in made) == plan.peak_reserved_bytes
    assert all(row[0] >= row[1] for row in made)  # a segment holds the request that made it


def test_the_measured_segments_name_what_made_each():
    bench = _bench_module()
    frame = {"filename": "/x/torch/nn/modules/conv.py", "line": 548, "name": "_conv_forward"}
    snapshot = {
        "segments": [
            {"segment_type": "large", "total_size": 20 << 20, "allocated_size": 0, "blocks": [{}]},
            {"segment_type": "large", "total_size": 400 << 20, "allocated_size": 0, "blocks": [{}, {}]},
        ],
        "device_traces": [
            [
                {"action": "segment_alloc", "size": 400 << 20, "frames": []},
                {"action": "alloc", "size": 399 << 20, "frames": [frame]},
                {"action": "free_completed", "size": 399 << 20},
            ]
        ],
    }  # fmt: skip
    segments = bench.measured_segments(snapshot)
    assert segments["held"] == [["large", 400 << 20, 0, 2], ["large", 20 << 20, 0, 1]]
    assert segments["made"] == [[400 << 20, 399 << 20, ["conv.py:548:_conv_forward"]]]
    line = bench._segments_line(
        "vit", {"measured": segments, "predicted": [[20 << 20, 1, "", "", 0, "", ""]]}
    )
    assert "measured [2MiB 0.000 20MiB 0.020 other<=100MiB 0.000 >100MiB 0.391] (2)" in line
