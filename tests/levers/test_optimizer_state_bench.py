"""bench/optimizer_state.py --quick on the CPU: every run, paired read and prediction written."""

from __future__ import annotations

import json

import pytest
from bench_module import bench_module


def _bench():
    return bench_module("optimizer_state.py", "optimizer_state_bench")


@pytest.mark.slow
def test_quick_run_writes_the_runs_the_paired_reads_and_the_prediction(tmp_path, monkeypatch):
    pytest.importorskip("torchao.optim")
    import torch

    monkeypatch.setattr(torch, "compile", torch.compile)  # --quick replaces it; put it back after
    assert _bench().main(["--quick", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "optimizer_state.json").read_text())
    assert result["meta"]["steps"] == 3 and result["meta"]["params"]["size"] == "tiny"
    rows = {row["variant"]: row for row in result["rows"]}
    assert list(rows) == ["fp32-fused", "adamw-bf16-state", "adamw-8bit"]
    for row in rows.values():
        for key in ("commit", "torch", "torchao", "gpu", "shape", "ms_per_step_median",
                    "ms_per_step_iqr", "state_moment_bytes"):
            assert key in row, key
        assert len(row["train_loss"]) == 3 and set(row["held_out_loss"]) == {"1", "2", "3"}
        assert len(row["held_out_loss"]["3"]) == 32  # the workload's held-out examples
    assert rows["adamw-bf16-state"]["inner"] == "BF16StateAdam"
    assert rows["adamw-8bit"]["inner"] == "AdamW8bit"
    fp32 = rows["fp32-fused"]["state_moment_bytes"]
    assert rows["adamw-bf16-state"]["state_moment_bytes"] * 2 == fp32
    for lever, pair in result["paired"].items():
        assert pair["held_out_loss_vs_fp32_final"]["verdict"] in ("PARITY", "IMPROVED", "DAMAGED")
        measured = pair["state_moment_bytes_vs_fp32"]
        predicted = pair["predicted_delta_state_bytes"]
        assert measured < 0 and abs(predicted - measured) <= 0.01 * abs(measured), lever
        assert pair["gpu"] == "cpu" and pair["commit"] == rows[lever]["commit"]
