"""bench/alternation_probe.py: two variants built side by side and timed in blocks, alternated
step by step and alternated in windows, each way read as B's tokens/s over A's."""

from __future__ import annotations

import json

import pytest
from bench_module import bench_module


def test_each_way_times_as_many_steps_of_each_side_in_its_own_order():
    probe = bench_module("alternation_probe.py", "bench_alternation_probe")
    assert probe.schedule("blocks", 3, 2) == [0, 0, 0, 1, 1, 1]
    # one of each, the order swapped every pair (as the sweep's head-to-head)
    assert probe.schedule("alternated", 3, 2) == [0, 1, 1, 0, 0, 1]
    # windows of two, the order swapped every pair of windows; the last window short
    assert probe.schedule("windows", 5, 2) == [0, 0, 1, 1, 1, 1, 0, 0, 0, 1]
    for way in probe.WAYS:
        order = probe.schedule(way, 7, 3)
        assert order.count(0) == order.count(1) == 7


def test_a_pair_is_built_side_by_side_and_read_three_ways(tmp_path):
    probe = bench_module("alternation_probe.py", "bench_alternation_probe")
    rc = probe.main(["--models", "zoo@nanogpt", "--size", "tiny", "--device", "cpu",
                     "--pairs", "peer:compile-model;compile-model|compile-model;sdpa-attention",
                     "--warmup", "1", "--steps", "3", "--window", "2", "--min-timed-s", "0",
                     "--out", str(tmp_path)])
    assert rc == 0
    [row] = json.loads((tmp_path / "summary.json").read_text())["rows"]
    ran, refused = row["pairs"]
    assert ran["pair"] == ["peer:compile-model", "compile-model"] and ran["status"] == "ok"
    assert set(ran["ways"]) == {"blocks", "alternated", "windows"}
    for way in ran["ways"].values():
        assert way["steps"] == 3 and len(way["median_ms"]) == 2
        low, high = way["ci95"]
        assert low <= high and all(m > 0 for m in way["median_ms"])
    # a variant that does not apply is a row that says why, not a crash
    assert refused["status"] == "failed" and "sdpa-attention does not apply" in refused["error"]


@pytest.mark.parametrize("pairs, said", [
    ("compile-model", "a pair is two variants separated by ';'"),
    ("compile-model;peer:compile-fast", "a peer is a variant of its own, one of peer:"),
])
def test_bad_pairs_are_refused_before_anything_is_built(tmp_path, capsys, pairs, said):
    probe = bench_module("alternation_probe.py", "bench_alternation_probe")
    with pytest.raises(SystemExit) as stopped:
        probe.main(["--models", "zoo@nanogpt", "--size", "tiny", "--device", "cpu",
                    "--pairs", pairs, "--out", str(tmp_path)])
    assert stopped.value.code == 2 and said in capsys.readouterr().err
    assert not (tmp_path / "summary.json").exists()
