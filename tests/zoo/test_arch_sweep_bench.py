"""bench/arch_sweep.py end to end on the CPU: its worker processes, rows, summary, a timeout."""

from __future__ import annotations

import json

import pytest
from bench_module import bench_module

pytest.importorskip("transformers")


def _bench():
    return bench_module("arch_sweep.py", "bench_arch_sweep")


def test_a_run_writes_a_row_per_architecture_and_lever_and_a_summary(tmp_path):
    bench = _bench()
    code = bench.main(["--only", "bloom,imagegpt", "--levers", "ac-full,fused-optimizer,float8",
                       "--out", str(tmp_path)])
    assert code == 0
    rows = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    by = {(r["arch"], r["lever"]): r for r in rows}
    assert set(by) == {("bloom", None), ("bloom", "ac-full"), ("bloom", "fused-optimizer"),
                       ("bloom", "float8"), ("imagegpt", None)}
    assert by[("bloom", None)]["built"] and by[("bloom", None)]["params_count"] > 0
    assert not by[("imagegpt", None)]["built"] and "input_ids" in by[("imagegpt", None)]["error"]
    assert by[("bloom", "ac-full")]["parity"]["verdict"] == "PARITY"
    assert by[("bloom", "ac-full")]["undo_ok"] is True
    assert by[("bloom", "fused-optimizer")]["applies"] == "it is already fused"
    assert by[("bloom", "float8")]["skipped"]
    assert all(r["torch"] and r["commit"] and "timm" in r for r in rows)
    summary = (tmp_path / "summary.md").read_text()
    assert "| transformers | 2 | 1 | 1 |" in summary
    assert "| ac-full | 1 | 1 | 0 | 0 | 0 | 0 | 0 | 0 | 0 | 0 |" in summary
    assert "imagegpt" in summary.split("### Not built, by reason")[1]
    # a second run of one architecture replaces its rows, keeps the others
    bench.main(["--only", "imagegpt", "--levers", "ac-full", "--out", str(tmp_path)])
    again = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert len(again) == len(rows) and {r["arch"] for r in again} == {"bloom", "imagegpt"}
    # one lever run again (a lever new to the catalogue) replaces its rows and the build row
    # only: the other levers' rows of that architecture stay
    bench.main(["--only", "bloom", "--levers", "fused-optimizer", "--out", str(tmp_path)])
    third = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert sorted((r["arch"], r["lever"] or "") for r in third) == sorted(
        (r["arch"], r["lever"] or "") for r in rows)
    assert by[("bloom", "ac-full")] in third


def test_an_architecture_that_runs_out_of_time_is_a_row_not_a_crash(tmp_path):
    bench = _bench()
    bench.main(["--only", "opt", "--levers", "ac-full", "--timeout-s", "0.5",
                "--out", str(tmp_path)])
    (row,) = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert row["lever"] is None and not row["built"]
    assert row["error"] == "timeout: the architecture's 0.5s were spent"


def test_a_sample_is_the_first_of_a_seeded_shuffle():
    bench = _bench()
    args = lambda n: bench.argparse.Namespace(  # noqa: E731
        only=None, library="transformers", timm_all=False, sample=n, seed=3)
    five, ten = bench.choose(args(5))[0], bench.choose(args(10))[0]
    assert ten[:5] == five and len(set(ten)) == 10
    assert "bart/seq2seq" in bench.transformers_architectures()
    assert "opt" in bench.transformers_architectures()


def test_a_lever_whose_parity_step_raised_is_listed_among_the_failures():
    bench = _bench()
    base = {"torch": "2", "transformers": "5", "timm": None, "commit": "c", "seconds": 1.0}
    rows = [
        {**base, "arch": "opt", "lever": None, "built": True},
        {**base, "arch": "opt", "lever": "autocast-bf16", "applies": None, "refused": None,
         "error": "candidate parity step 1 raised RuntimeError: overflow", "error_stage": "parity",
         "undo_ok": True, "parity": {"verdict": "N/A", "note": "nothing could be compared"}},
        {**base, "arch": "opt", "lever": "ac-full", "applies": None, "refused": None,
         "error": None, "undo_ok": True, "parity": {"verdict": "PARITY", "note": ""}},
    ]
    text = bench.summary(rows, "cmd")
    assert "| autocast-bf16 | 1 | 0 | 0 | 0 | 1 | 0 | 0 | 0 | 0 | 0 |" in text
    failures = text.split("## Failures")[1]
    assert "### autocast-bf16" in failures and "overflow" in failures
    assert "### ac-full" not in failures
