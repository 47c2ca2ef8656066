"""bench/in_step_stop.py: two A/Bs in one process, the first given a kill line it cannot meet,
the second run to its end after it; both recorded in result.json."""

from __future__ import annotations

import json

from bench_module import bench_module


def test_the_probe_records_a_stopped_a_b_and_the_one_after_it(tmp_path):
    probe = bench_module("in_step_stop.py", "bench_in_step_stop")
    rc = probe.main(["--model", "gpt2", "--kill-s", "0.001", "--then",
                     "compile-model:backend=eager", "--out", str(tmp_path)])
    assert rc == 0
    result = json.loads((tmp_path / "result.json").read_text())
    first, then = result["runs"]
    assert first["stack"] == ["compile-model"] and first["decision"] == "KILLED"
    assert "time budget of" in first["killed"]
    assert then["stack"] == ["compile-model:backend=eager"] and then["parity"] == "PARITY"
    assert then["killed"] is None and result["model"] == "gpt2"
