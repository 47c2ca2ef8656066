"""bench/stack_probe.py: stacks timed beside the default, and a probe's transform that is no
lever yet (channels-last) applied to the built model before the stack's levers."""

from __future__ import annotations

import json

import torch

from bench_module import bench_module


def test_channels_last_is_timed_alone_and_under_a_lever_with_the_model_converted(
        tmp_path, monkeypatch):
    probe = bench_module("stack_probe.py", "bench_stack_probe")
    converted = []
    original = probe.PROBE_TRANSFORMS["channels-last"]

    def spy(workload):
        original(workload)
        convs = [m.weight for m in workload.model.modules() if isinstance(m, torch.nn.Conv2d)]
        converted.append(bool(convs) and all(
            w.is_contiguous(memory_format=torch.channels_last) for w in convs))

    monkeypatch.setitem(probe.PROBE_TRANSFORMS, "channels-last", spy)
    rc = probe.main(["--models", "zoo@resnet", "--size", "tiny", "--device", "cpu",
                     "--stacks", "channels-last;channels-last+compile-model", "--warmup", "1",
                     "--steps", "2", "--min-timed-s", "0", "--out", str(tmp_path)])
    assert rc == 0
    [row] = json.loads((tmp_path / "summary.json").read_text())["rows"]
    status = {r["variant"]: r["status"] for r in row["rows"]}
    assert status == {"default": "ok", "channels-last": "ok",
                      "channels-last+compile-model": "ok"}
    assert converted == [True, True]
    applied = {r["variant"]: r.get("applied") for r in row["rows"]}
    assert applied["channels-last+compile-model"] == ["compile-model"]
    assert applied["channels-last"] is None  # no lever: the transform alone
