"""bench/catalogue_from_tune.py: levers tune's A/Bs on a GPU become rows of the catalogue that
``levers list`` reads, the confirming A/B over the selecting one, honest negatives kept."""

from __future__ import annotations

import json

from bench_module import bench_module
from levers.levers.catalogue import read_catalogue
from levers.tune.candidates import catalogue_expectations

ENV = {"levers_commit": "abc1234", "torch": "2.11.0+cu130",
       "gpu": {"name": "NVIDIA H100 80GB HBM3"}}
BERT = {"model": "bert", "size": "full", "device": "cuda"}


def _trial(base, stack, role, ratio, ci, peaks=(10e9, 8e9), **extra):
    return {"event": "tune-trial", "workload": "zoo", "params": BERT, "base": base,
            "stack": stack, "role": role, "tokens_per_s_ratio": ratio,
            "tokens_per_s_ci95": ci, "peak_allocated_bytes": list(peaks), "parity": "PARITY",
            "error": None, "killed": None, **extra}


def _session(tmp_path, events):
    folder = tmp_path / "results" / "s99"
    folder.mkdir(parents=True)
    lines = [json.dumps(e) for e in events]
    (folder / "tune.record.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def test_tune_s_increments_become_rows_and_the_rest_does_not(tmp_path):
    module = bench_module("catalogue_from_tune.py", "catalogue_from_tune")
    events = [
        _trial([], ["compile-blocks"], "selection", 1.12, [1.07, 1.15]),
        _trial([], ["compile-blocks"], "confirmation", 1.15, [1.14, 1.16]),
        _trial(["compile-blocks"], ["compile-blocks", "loss-valid-rows"], "selection", 1.17,
               [1.08, 1.31]),
        _trial(["compile-blocks"], ["compile-blocks", "loss-valid-rows"], "confirmation", 1.14,
               [1.10, 1.16]),
        _trial(["compile-blocks", "loss-valid-rows"],
               ["compile-blocks", "loss-valid-rows", "sdpa-cudnn-backend"], "selection", 0.84,
               [0.82, 0.91]),
        # an option form, a replacement in the stack, a trial the budget stopped: no rows
        _trial([], ["compile-model:mode=default"], "selection", 0.92, [0.91, 0.93]),
        _trial(["compile-blocks", "loss-valid-rows"],
               ["compile-blocks:mode=max-autotune-no-cudagraphs", "loss-valid-rows"],
               "selection", 1.15, [1.03, 1.17]),
        _trial(["compile-blocks"], ["compile-blocks", "float8"], "selection", 1.3, [1.0, 1.6],
               killed="budget"),
        {"event": "tune-result", "params": BERT, "environment": ENV},
        # a search the session cut before its result: no environment, no rows
        _trial([], ["compile-model"], "selection", 2.0, [1.9, 2.1]),
    ]
    rows = module.rows_of_session(_session(tmp_path, events), "s99")
    by = {(tuple(r["levers"])): r for r in rows}
    assert sorted(by) == [("compile-blocks",), ("compile-blocks", "loss-valid-rows"),
                          ("compile-blocks", "loss-valid-rows", "sdpa-cudnn-backend")]
    alone = by[("compile-blocks",)]
    assert alone["tokens_per_s_ratio"] == 1.15  # the confirmation, not the selection
    assert alone["baseline"] == "zoo:default" and alone["shape"] == "model=bert size=full"
    assert "confirming" in alone["note"] and "s99" in alone["note"]
    assert (alone["gpu"], alone["commit"]) == ("NVIDIA H100 80GB HBM3", "abc1234")
    on_blocks = by[("compile-blocks", "loss-valid-rows")]
    assert on_blocks["lever"] == "loss-valid-rows"
    assert on_blocks["baseline"] == "zoo:lever:compile-blocks"
    assert on_blocks["peak_allocated_delta_bytes"] == -2e9
    slower = by[("compile-blocks", "loss-valid-rows", "sdpa-cudnn-backend")]
    assert slower["tokens_per_s_ratio"] == 0.84  # the honest negative stays

    # what the catalogue reads: the effects; tune's order reads the single-lever rows only
    out = tmp_path / "catalogue.json"
    assert module.main([str(tmp_path / "results"), "--out", str(out)]) == 0
    measured = read_catalogue(out)
    assert {(m.lever, m.effect) for m in measured} == {
        ("compile-blocks", "faster"), ("loss-valid-rows", "faster"),
        ("sdpa-cudnn-backend", "slower")}
    assert set(catalogue_expectations(measured)) == {"compile-blocks"}


def test_a_session_kept_as_one_record_file_beside_the_others_gives_rows(tmp_path):
    module = bench_module("catalogue_from_tune.py", "catalogue_from_tune")
    results = tmp_path / "results"
    results.mkdir()
    events = [_trial([], ["compile-model"], "confirmation", 1.4, [1.3, 1.5]),
              {"event": "tune-result", "params": BERT, "environment": ENV}]
    (results / "s40a.record.jsonl").write_text("\n".join(json.dumps(e) for e in events) + "\n")
    out = tmp_path / "catalogue.json"
    assert module.main([str(results), "--out", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert row["lever"] == "compile-model" and "session s40a" in row["note"]


def test_the_committed_catalogues_are_what_the_script_makes_of_the_committed_records(tmp_path):
    # a tune record committed without its rows, or rows edited by hand, fails here (the dates
    # aside: some come from git's history, which a copy without it lacks)
    module = bench_module("catalogue_from_tune.py", "catalogue_from_tune")
    results = module.ROOT / "bench" / "results"

    def undated(rows):
        return [{k: v for k, v in row.items() if k != "date"} for row in rows]

    for gpu in ("h100", "h200"):
        out = tmp_path / f"{gpu}.json"
        assert module.main([str(results / f"tune_sweep_{gpu}"), "--out", str(out)]) == 0
        made = json.loads(out.read_text())["rows"]
        committed = json.loads(
            (results / f"levers_catalogue_tune_{gpu}" / "catalogue.json").read_text())["rows"]
        assert len(made) > 40 and undated(made) == undated(committed)
