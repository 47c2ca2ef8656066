"""bench/varlen.py --quick on the CPU: every sdpa layout runs on the same sequences, the rows
carry what a GPU row must, and levers list can read the catalogue it writes; with --lengths
varied the rows also carry the widths the model saw, the graphs compiled and the steady steps."""

from __future__ import annotations

import json

import pytest
from bench_module import bench_module


def _bench():
    return bench_module("varlen.py", "bench_varlen")


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


@pytest.mark.slow
def test_quick_varied_run_records_the_widths_the_compiles_and_the_steady_steps(tmp_path):
    pytest.importorskip("transformers")
    from levers.batches import varied_lengths

    variants = ("padded@sdpa,pad-to-multiple@sdpa,packing@sdpa,padded+compile@sdpa,"
                "pad-to-multiple+compile@sdpa")
    assert _bench().main(["--quick", "--lengths", "varied", "--compile-backend", "eager",
                          "--variants", variants, "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "summary.json").read_text())
    rows = {row["variant"]: row for row in doc["rows"]}
    lengths = [list(varied_lengths(8, 128, seed=0, step=k)) for k in range(3)]  # 1 + 2 steps
    widths = [max(n) for n in lengths]
    assert len(set(widths)) == 3
    padded = rows["padded@sdpa"]
    for row in rows.values():
        assert row["status"] == "ok", row.get("error")
        assert "lengths=varied" in row["shape"]
        assert row["lengths_of_steps"] == lengths
        assert row["real_tokens_of_steps"] == [sum(n) for n in lengths]
        assert len(row["step_s_of_steps"]) == len(row["loss_per_real_token"]) == 3
        assert row["all_steps_s"] == pytest.approx(sum(row["step_s_of_steps"]))
        assert row["dynamo"]["recompile_limit"] >= 3 + 64
        # the steady steps are the timed ones that compiled nothing; tokens/s is read over them
        assert row["steady_steps"] == [k for k in (1, 2) if row["compiled_graphs_of_steps"][k] == 0]
        assert len(row["real_tokens_per_s_samples"]) == len(row["steady_steps"])
        for a, b in zip(row["loss_per_real_token"], padded["loss_per_real_token"]):
            assert a == pytest.approx(b, rel=1e-5)
    assert padded["input_shapes_of_steps"] == [[8, w] for w in widths]
    assert padded["num_distinct_widths"] == 3 and padded["compiled_graphs"] == 0
    rounded = [[8, -(-w // 64) * 64] for w in widths]
    for variant in ("pad-to-multiple@sdpa", "pad-to-multiple+compile@sdpa"):
        assert rows[variant]["input_shapes_of_steps"] == rounded
        assert rows[variant]["num_distinct_widths"] == len({w for _, w in rounded}) < 3
    assert all(shape[1] == w for shape, w in zip(rows["packing@sdpa"]["input_shapes_of_steps"],
                                                 widths))
    # compiled: the first step compiles, and so does every step that meets a new width until
    # dynamo makes the width dynamic
    for variant in ("padded+compile@sdpa", "pad-to-multiple+compile@sdpa"):
        row = rows[variant]
        assert row["compiled_graphs"] >= 1 and 0 in row["compile_steps"]
        assert row["compile_steps"] == [k for k, n in enumerate(row["compiled_graphs_of_steps"])
                                        if n]
        assert row["compile_steps_s"] == pytest.approx(
            sum(row["step_s_of_steps"][k] for k in row["compile_steps"]))
    pad_compiled = rows["pad-to-multiple+compile@sdpa"]
    assert 2 not in pad_compiled["compile_steps"]  # its third step repeats the second's width
    comparisons = {c["variant"]: c for c in doc["comparisons"]}
    entry = comparisons["pad-to-multiple+compile@sdpa"]
    assert entry["baseline"] == "padded+compile@sdpa"
    assert entry["num_distinct_widths"] == {"baseline": 3, "variant": 2}
    catalogue = json.loads((tmp_path / "catalogue.json").read_text())["rows"]
    assert all("distinct widths" in row["note"] for row in catalogue)


@pytest.mark.slow
def test_with_static_widths_every_new_width_compiles_and_pad_to_multiple_compiles_fewer(tmp_path):
    pytest.importorskip("transformers")
    assert _bench().main(["--quick", "--lengths", "varied", "--static-widths",
                          "--compile-backend", "eager", "--variants",
                          "padded+compile@sdpa,pad-to-multiple+compile@sdpa",
                          "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "summary.json").read_text())
    rows = {row["variant"]: row for row in doc["rows"]}
    padded, rounded = rows["padded+compile@sdpa"], rows["pad-to-multiple+compile@sdpa"]
    for row in (padded, rounded):
        assert row["shape"].endswith("widths=static")
        assert row["dynamo"]["automatic_dynamic_shapes"] is False
    # widths 128, 63, 58: a program each; rounded to 128, 64, 64: the third step reuses one
    assert padded["compiled_graphs_of_steps"] == [1, 1, 1] and padded["steady_steps"] == []
    assert padded["real_tokens_per_s"] is None
    assert rounded["compiled_graphs_of_steps"] == [1, 1, 0] and rounded["steady_steps"] == [2]
    entry = doc["comparisons"][0]
    assert entry["real_tokens_per_s_ratio"] is None
    assert entry["compiled_graphs"] == {"baseline": 3, "variant": 2}
    import torch

    assert torch._dynamo.config.automatic_dynamic_shapes is True  # put back after the rows
