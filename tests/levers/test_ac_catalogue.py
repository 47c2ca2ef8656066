"""The checkpointing levers' catalogue rows, read from bench/ac_policies.py's committed H200 run."""

from __future__ import annotations

import json
from pathlib import Path

from levers.levers.catalogue import catalogue_paths, measurements_by_lever, read_catalogue

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results" / "ac_policies_h200"


def test_the_repo_catalogue_reads_the_ac_policies_summary(monkeypatch) -> None:
    monkeypatch.delenv("LEVERS_CATALOGUE", raising=False)
    assert RESULTS / "summary.json" in catalogue_paths()


def test_ac_rows_are_ratios_against_none_at_the_same_batch() -> None:
    summary = json.loads((RESULTS / "summary.json").read_text())
    by = measurements_by_lever(read_catalogue(RESULTS / "summary.json"))
    assert set(by) == {"ac-full", "ac-selective", "ac-budget"}  # the torchtitan peer is no lever
    none = {r["batch_size"]: r for r in summary if r["policy"] == "none"}
    full = {r["batch_size"]: r for r in summary if r["policy"] == "ac-full"}
    rows = {m.shape: m for m in by["ac-full"]}
    assert len(rows) == 2
    for batch in (4, 8):
        m = rows[f"arch=llama size=1b batch_size={batch} seq_len=2048"]
        assert m.tokens_per_s_ratio == full[batch]["tokens_per_s"] / none[batch]["tokens_per_s"]
        assert m.tokens_per_s_ratio_ci95 == (
            full[batch]["tokens_per_s_ci95"][0] / none[batch]["tokens_per_s_ci95"][1],
            full[batch]["tokens_per_s_ci95"][1] / none[batch]["tokens_per_s_ci95"][0],
        )
        assert m.peak_allocated_delta_bytes == (
            full[batch]["peak_allocated_bytes"] - none[batch]["peak_allocated_bytes"]
        )
        assert (m.baseline, m.workload, m.gpu) == ("none", "hf", "NVIDIA H200")
        assert m.torch == "2.11.0+cu130"
        assert m.commit == full[batch]["commit"]
    assert rows["arch=llama size=1b batch_size=4 seq_len=2048"].effect == "slower"
    budget = by["ac-budget"]
    assert len(budget) == sum(1 for r in summary if r["policy"] == "ac-budget")
    failed = [m for m in budget if m.status == "failed"]
    assert failed and all(m.error and m.effect == "failed" for m in failed)
    assert any(m.shape.endswith("budget=22.00GiB") for m in budget)


def test_levers_list_shows_the_ac_rows(capsys, monkeypatch) -> None:
    from levers.cli import main

    monkeypatch.delenv("LEVERS_CATALOGUE", raising=False)
    assert main(["list", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    measured = {lever["id"]: lever["measured"] for lever in doc["levers"]}
    ac_policies = [row for row in measured["ac-full"] if row["workload"] == "hf"]
    assert len(ac_policies) == 2
    assert all(row["baseline"] == "none" for row in ac_policies)
