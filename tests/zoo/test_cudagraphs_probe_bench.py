"""bench/cudagraphs_probe.py: eager and each stack built fresh on one model, with dynamo's counters
and one profiled step (on a CPU: no kernels on a GPU, none launched, none replayed)."""

from __future__ import annotations

import json

from bench_module import bench_module


def test_each_stack_is_timed_with_what_dynamo_did_and_one_profiled_step(tmp_path):
    probe = bench_module("cudagraphs_probe.py", "bench_cudagraphs_probe")
    rc = probe.main(["--models", "zoo@resnet", "--size", "tiny", "--device", "cpu",
                     "--stacks", "channels-last;compile-model", "--warmup", "1", "--steps", "2",
                     "--out", str(tmp_path)])
    assert rc == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    rows = summary["models"]["zoo@resnet"]["rows"]
    assert [r["stack"] for r in rows] == [[], ["channels-last"], ["compile-model"]]
    assert all(r["status"] == "ok" and len(r["dur_s"]) == 2 and r["median_ms"] > 0 for r in rows)
    assert all(r["gpu_kernels"] == 0 and r["graph_launches"] == 0 for r in rows)
    # the compiled stack's counters say what dynamo built; eager's say nothing was
    assert rows[2]["counters"]["stats"]["unique_graphs"] >= 1
    assert "unique_graphs" not in rows[0]["counters"].get("stats", {})
