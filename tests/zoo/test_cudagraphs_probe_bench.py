"""bench/cudagraphs_probe.py: eager, each stack and each peer's form built fresh on one model, with
dynamo's counters and one profiled step (on a CPU: no kernels on a GPU, none launched, none
replayed); tune's A/B of an increment as tune times it and as the user runs it."""

from __future__ import annotations

import json

import pytest

from bench_module import bench_module


def test_each_stack_is_timed_with_what_dynamo_did_and_one_profiled_step(tmp_path):
    probe = bench_module("cudagraphs_probe.py", "bench_cudagraphs_probe")
    rc = probe.main(["--models", "zoo@resnet", "--size", "tiny", "--device", "cpu",
                     "--stacks", "channels-last;compile-model;peer:compile-layers",
                     "--ab", ">channels-last", "--stacks-after", "channels-last",
                     "--warmup", "1", "--steps", "2",
                     "--out", str(tmp_path)])
    assert rc == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    model = summary["models"]["zoo@resnet"]
    rows = model["rows"]
    assert [(r["stack"], r["after_ab"]) for r in rows] == [
        ([], False), (["channels-last"], False), (["compile-model"], False),
        (["peer:compile-layers"], False), (["channels-last"], True)]
    assert all(r["status"] == "ok" and len(r["dur_s"]) == 2 and r["median_ms"] > 0 for r in rows)
    assert all(r["gpu_kernels"] == 0 and r["graph_launches"] == 0 and r["top_kernels"] == []
               and r["alloc_retries"] is None
               for r in rows)
    # the compiled stack's and the peer's counters say what dynamo built; eager's say nothing was
    assert rows[2]["counters"]["stats"]["unique_graphs"] >= 1
    assert rows[3]["counters"]["stats"]["unique_graphs"] >= 1
    assert "unique_graphs" not in rows[0]["counters"].get("stats", {})
    # the increment's A/B, as tune times it and as run: each a trial with both sides' steps
    assert [(t["base"], t["stack"], t["as_run"]) for t in model["ab"]] == [
        ([], ["channels-last"], False), ([], ["channels-last"], True)]
    for trial in model["ab"]:
        assert trial["status"] == "ok" and trial["error"] is None and trial["alloc_retries"] is None
        assert trial["tokens_per_s_ratio"] > 0 and len(trial["step_ms_each"]) == 2


@pytest.mark.parametrize("given, said", [
    (["--ab", "channels-last"], "write BASE>STACK"),
    (["--stacks-after", "channels-last"], "name them with --ab"),
])
def test_a_malformed_increment_is_refused_before_anything_runs(tmp_path, capsys, given, said):
    probe = bench_module("cudagraphs_probe.py", "bench_cudagraphs_probe")
    with pytest.raises(SystemExit) as exit_info:
        probe.main(["--models", "zoo@resnet", *given, "--out", str(tmp_path / "out")])
    assert exit_info.value.code == 2
    assert said in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


class _Kernel:
    def __init__(self, name: str, us: float) -> None:
        self.name, self.device_time_total = name, us


def test_top_kernels_sum_each_name_and_rank_by_gpu_time():
    probe = bench_module("cudagraphs_probe.py", "bench_cudagraphs_probe")
    kernels = [_Kernel("gemm_e4m3", 300.0), _Kernel("amax", 50.0), _Kernel("gemm_e4m3", 250.0),
               _Kernel("gemm_bf16", 400.0)]
    assert probe.top_kernels(kernels, count=2) == [
        {"name": "gemm_e4m3", "count": 2, "ms": 0.55}, {"name": "gemm_bf16", "count": 1, "ms": 0.4}]
