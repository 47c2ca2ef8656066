"""bench/stack_probe.py: stacks of levers timed beside the default, channels-last alone and under
whole-model compile among them."""

from __future__ import annotations

import json

import pytest
from bench_module import bench_module


def _probed(tmp_path, model: str, stacks: str) -> dict:
    """The summary row of ``stacks`` timed on the tiny ``model`` on this CPU, briefly."""
    probe = bench_module("stack_probe.py", "bench_stack_probe")
    rc = probe.main(["--models", model, "--size", "tiny", "--device", "cpu", "--stacks", stacks,
                     "--warmup", "1", "--steps", "2", "--min-timed-s", "0",
                     "--out", str(tmp_path)])
    assert rc == 0
    [row] = json.loads((tmp_path / "summary.json").read_text())["rows"]
    return row


def test_channels_last_is_timed_alone_and_under_compile_model_as_a_lever(tmp_path):
    row = _probed(tmp_path, "zoo@resnet", "channels-last;channels-last+compile-model")
    status = {r["variant"]: r["status"] for r in row["rows"]}
    assert status == {"default": "ok", "channels-last": "ok",
                      "channels-last+compile-model": "ok"}
    applied = {r["variant"]: r.get("applied") for r in row["rows"]}
    assert applied["channels-last"] == ["channels-last"]
    assert applied["channels-last+compile-model"] == ["channels-last", "compile-model"]
    assert set(row["ratios"]) == {"channels-last", "channels-last+compile-model"}


def test_a_peer_is_timed_as_the_sweep_times_it_beside_levers_forms(tmp_path):
    row = _probed(tmp_path, "zoo@nanogpt", "peer:compile-model;compile-model")
    by_variant = {r["variant"]: r for r in row["rows"]}
    assert {v: r["status"] for v, r in by_variant.items()} == {
        "default": "ok", "peer:compile-model": "ok", "compile-model": "ok"}
    # the peer is the sweep's transform (its KV cache off, no levers applied); the stack levers'
    assert by_variant["peer:compile-model"].get("cache_off") is True
    assert "applied" not in by_variant["peer:compile-model"]
    assert by_variant["compile-model"]["applied"] == ["compile-model"]
    assert set(row["vs_first"]) == {"compile-model"}



def test_a_peer_inside_a_stack_or_unknown_is_refused_before_anything_is_built(tmp_path, capsys):
    probe = bench_module("stack_probe.py", "bench_stack_probe")
    for stacks in ("compile-model;peer:compile-model+sdpa-attention", "peer:compile-fast"):
        with pytest.raises(SystemExit) as stopped:
            probe.main(["--models", "zoo@nanogpt", "--size", "tiny", "--device", "cpu",
                        "--stacks", stacks, "--out", str(tmp_path)])
        assert stopped.value.code == 2
        assert "a peer is a stack of its own, one of peer:compile-model, " in (
            capsys.readouterr().err)
    assert not (tmp_path / "summary.json").exists()


def test_rounds_time_each_stack_again_in_reversed_order_and_give_each_one_s_spread(tmp_path):
    probe = bench_module("stack_probe.py", "bench_stack_probe")
    assert probe.in_rounds(["default", "a", "b+c"], 2) == [
        ("default", 1), ("a", 1), ("b+c", 1), ("b+c", 2), ("a", 2), ("default", 2)]
    rc = probe.main(["--models", "zoo@nanogpt", "--size", "tiny", "--device", "cpu",
                     "--stacks", "compile-model", "--rounds", "2", "--warmup", "1",
                     "--steps", "2", "--min-timed-s", "0", "--out", str(tmp_path)])
    assert rc == 0
    [row] = json.loads((tmp_path / "summary.json").read_text())["rows"]
    assert [r["variant"] for r in row["rows"]] == [
        "default", "compile-model", "compile-model#2", "default#2"]
    assert {v: len(ms) for v, ms in row["rounds_ms"].items()} == {
        "default": 2, "compile-model": 2}
    for variant, ms in row["rounds_ms"].items():
        assert row["spread"][variant] == pytest.approx(max(ms) / min(ms) - 1.0)
    # the first round's ratios, as without rounds
    assert "compile-model" in row["ratios"]


def test_no_round_is_refused_before_anything_is_built(tmp_path, capsys):
    probe = bench_module("stack_probe.py", "bench_stack_probe")
    with pytest.raises(SystemExit):
        probe.main(["--models", "zoo@nanogpt", "--size", "tiny", "--device", "cpu",
                    "--stacks", "sdpa-attention", "--rounds", "0", "--out", str(tmp_path)])
    assert "--rounds must be at least 1, got 0" in capsys.readouterr().err
    assert not (tmp_path / "summary.json").exists()
