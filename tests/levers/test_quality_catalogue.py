"""The catalogue's quality rows (bench/quality_catalogue.py): a numerics-changing lever proven by
a held-out-loss read, its step time left out where the run shared the GPU, as levers list shows."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from levers.levers.catalogue import measurements_by_lever, read_catalogue

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
sys.path.insert(0, str(ROOT / "bench"))

import quality_catalogue  # noqa: E402


def test_rows_from_the_committed_reads_carry_the_quality_and_no_step_time(tmp_path) -> None:
    state = RESULTS / "optimizer_state_h200" / "bf16_optimizer_state.json"
    ab = RESULTS / "float8_quality_h200" / "ab.json"
    quality_catalogue.main(["--out", str(tmp_path), "--contended", "--optimizer-state", str(state),
                            "--ab", f"float8={ab}"])
    by = measurements_by_lever(read_catalogue(tmp_path / "catalogue.json"))
    assert set(by) == {"adamw-bf16-state", "float8"}
    bf16 = by["adamw-bf16-state"][0]
    doc = json.loads(state.read_text())
    final = doc["paired"]["adamw-bf16-state"]["held_out_loss_vs_fp32_final"]
    assert bf16.effect == "not timed" and bf16.tokens_per_s_ratio is None
    assert "after 500 steps" in bf16.quality and final["verdict"] in bf16.quality
    assert bf16.note and "not shown" in bf16.note
    rows = {r["variant"]: r for r in doc["rows"]}
    assert bf16.peak_allocated_delta_bytes == (
        rows["adamw-bf16-state"]["peak_allocated_bytes"] - rows["fp32-fused"]["peak_allocated_bytes"]
    )
    float8 = by["float8"][0]
    assert float8.quality.startswith("held-out loss after 200 steps") and "PARITY" in float8.quality
    assert float8.commit == json.loads(ab.read_text())["environment"]["levers_commit"]


def test_levers_list_shows_a_quality_row(capsys, monkeypatch) -> None:
    from levers.cli import main

    monkeypatch.delenv("LEVERS_CATALOGUE", raising=False)
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    section = out[out.index("adamw-bf16-state  ["):]
    section = section[: section.index("known problems")]
    assert "tokens/s not timed" in section and "quality: held-out loss after 500 steps" in section
