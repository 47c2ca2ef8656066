"""bench/varlen.py --quick on the CPU: every sdpa layout runs on the same sequences, the rows
carry what a GPU row must, and levers list can read the catalogue it writes."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "varlen.py"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_varlen", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_quick_run_writes_rows_comparisons_and_a_catalogue(tmp_path):
    pytest.importorskip("transformers")
    assert _bench().main(["--quick", "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "summary.json").read_text())
    rows = {row["variant"]: row for row in doc["rows"]}
    assert set(rows) == {"padded@sdpa", "packing@sdpa", "padding-free@sdpa",
                         "pad-to-multiple@sdpa"}
    padded = rows["padded@sdpa"]
    for row in rows.values():
        assert row["status"] == "ok", row.get("error")
        assert {"commit", "torch", "gpu", "date", "shape"} <= set(row)
        assert row["real_tokens_per_step"] == sum(row["lengths"]) == padded["real_tokens_per_step"]
        assert set(row["real_tokens_per_s"]) == {"median", "min", "max", "p10", "p90"}
        assert len(row["loss_per_real_token"]) == 3  # 1 warm-up + 2 timed
        # the same sequences in every layout: the same loss per real token, within fp32 rounding
        for a, b in zip(row["loss_per_real_token"], padded["loss_per_real_token"]):
            assert a == pytest.approx(b, rel=1e-5)
    width = max(padded["lengths"])
    assert padded["computed_tokens_per_step"] == len(padded["lengths"]) * width
    assert rows["padding-free@sdpa"]["computed_tokens_per_step"] == padded["real_tokens_per_step"]
    assert rows["packing@sdpa"]["computed_tokens_per_step"] < padded["computed_tokens_per_step"]
    assert rows["pad-to-multiple@sdpa"]["computed_tokens_per_step"] % 64 == 0
    catalogue = json.loads((tmp_path / "catalogue.json").read_text())["rows"]
    assert {row["lever"] for row in catalogue} == {"packing", "padding-free", "pad-to-multiple"}

    from levers.levers.catalogue import read_catalogue

    measured = read_catalogue(tmp_path / "catalogue.json")
    assert {m.lever for m in measured} == {"packing", "padding-free", "pad-to-multiple"}
    # a second call with one variant keeps the other rows and replaces its own
    bench = _bench()
    assert bench.main(["--quick", "--variants", "packing@sdpa", "--out", str(tmp_path)]) == 0
    again = json.loads((tmp_path / "summary.json").read_text())["rows"]
    assert sorted(r["variant"] for r in again) == sorted(rows)


def test_a_bad_variant_is_refused_before_anything_runs(tmp_path):
    with pytest.raises(ValueError, match="LAYOUT"):
        _bench().main(["--quick", "--variants", "packed@sdpa", "--out", str(tmp_path)])
    assert not (tmp_path / "summary.json").exists()
