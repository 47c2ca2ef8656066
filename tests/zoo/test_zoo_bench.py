"""bench/zoo.py at size tiny on the CPU: the rows, the per-model summary, a bad --only."""

from __future__ import annotations

import json

import pytest
from bench_module import bench_module

pytest.importorskip("transformers")


def _bench():
    return bench_module("zoo.py", "bench_zoo")


def test_a_tiny_cpu_run_writes_rows_and_the_models_summary(tmp_path):
    only = "gpt2:compile-layers,gpt2:lever:compile-blocks,gpt2:liger"
    code = _bench().main(["--device", "cpu", "--size", "tiny", "--only", only, "--steps", "2",
                          "--warmup", "1", "--out", str(tmp_path)])
    assert code == 0
    doc = json.loads((tmp_path / "summary.json").read_text())
    rows = {row["variant"]: row for row in doc["rows"]}
    assert set(rows) == {"default", "compile-layers", "lever:compile-blocks", "liger"}
    for name in ("default", "compile-layers", "lever:compile-blocks"):
        row = rows[name]
        assert row["status"] == "ok", row.get("error")
        assert row["step_ms_spread"][0] <= row["step_ms"] <= row["step_ms_spread"][1]
        assert {"commit", "torch", "gpu", "shape", "tokens_per_s_ci95"} <= set(row)
    # the peer as users write it recompiles per block (the KV cache); the lever compiles once
    assert rows["compile-layers"]["compile"]["recompiles"] >= 1
    assert rows["lever:compile-blocks"]["compile"] == {
        "frames_compiled": 1, "recompiles": 0, "graph_breaks": 0, "recompile_limit_hit": False,
        "graph_break_reasons": [],
    }
    assert rows["liger"]["status"] == "not-applicable"
    (model,) = doc["models"]
    assert model["best_peer"] == "compile-layers" and model["best_levers"] == "lever:compile-blocks"


def test_an_unknown_model_is_refused_before_anything_runs(tmp_path):
    with pytest.raises(SystemExit, match="unknown model 'gpt3'"):
        _bench().main(["--device", "cpu", "--size", "tiny", "--only", "gpt3", "--out", str(tmp_path)])
    assert not (tmp_path / "summary.json").exists()
