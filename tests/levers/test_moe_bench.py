"""bench/moe.py's catalogue rows, from the committed H200 run: each lever's ratio is the median
tokens/s of its variant over its baseline's, and the renamed variant of an earlier revision reads
as the lever's."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import moe  # noqa: E402

RUN = ROOT / "bench" / "results" / "moe_h200" / "moe.json"


def test_catalogue_rows_are_median_ratios_against_their_baselines(tmp_path) -> None:
    doc = json.loads(RUN.read_text())
    assert moe.main(["--catalogue-from", str(RUN), "--catalogue-out", str(tmp_path),
                     "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "catalogue.json").read_text())["rows"]
    samples = {moe.RENAMED.get(r["variant"], r["variant"]): r["tokens_per_s_samples"]
               for r in doc["rows"] if r["status"] == "ok"}
    # the pairs this run has both sides of, in the catalogue's order
    ran = [entry for entry in moe.CATALOGUE if entry[1] in samples and entry[2] in samples]
    assert len(ran) >= 4
    assert [(r["lever"], r["baseline"]) for r in rows] == [(lever, base) for lever, _, base in ran]
    for row, (lever, variant, baseline) in zip(rows, ran):
        expected = statistics.median(samples[variant]) / statistics.median(samples[baseline])
        assert row["tokens_per_s_ratio"] == expected
        low, high = row["tokens_per_s_ratio_ci95"]
        assert low <= expected <= high
        assert row["commit"] == doc["commit"] and row["workload"] == "zoo"
    autocast = rows[[r["lever"] for r in rows].index("grouped-mm-autocast")]
    assert autocast["tokens_per_s_ratio"] > 2  # the fp32 experts, measured


def test_the_committed_catalogue_is_what_the_run_gives(tmp_path) -> None:
    moe.main(["--catalogue-from", str(RUN), "--catalogue-out", str(tmp_path), "--out", str(tmp_path)])
    committed = ROOT / "bench" / "results" / "levers_catalogue_moe_h200" / "catalogue.json"
    assert json.loads((tmp_path / "catalogue.json").read_text()) == json.loads(committed.read_text())
