"""bench/stack_probe.py: stacks of levers timed beside the default, channels-last alone and under
whole-model compile among them."""

from __future__ import annotations

import json

from bench_module import bench_module


def test_channels_last_is_timed_alone_and_under_compile_model_as_a_lever(tmp_path):
    probe = bench_module("stack_probe.py", "bench_stack_probe")
    rc = probe.main(["--models", "zoo@resnet", "--size", "tiny", "--device", "cpu",
                     "--stacks", "channels-last;channels-last+compile-model", "--warmup", "1",
                     "--steps", "2", "--min-timed-s", "0", "--out", str(tmp_path)])
    assert rc == 0
    [row] = json.loads((tmp_path / "summary.json").read_text())["rows"]
    status = {r["variant"]: r["status"] for r in row["rows"]}
    assert status == {"default": "ok", "channels-last": "ok",
                      "channels-last+compile-model": "ok"}
    applied = {r["variant"]: r.get("applied") for r in row["rows"]}
    assert applied["channels-last"] == ["channels-last"]
    assert applied["channels-last+compile-model"] == ["channels-last", "compile-model"]
    assert set(row["ratios"]) == {"channels-last", "channels-last+compile-model"}
