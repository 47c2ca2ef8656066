"""bench/tune_sweep.py's choice of models: the seeded sample beyond the zoo, tasks, parts."""

from __future__ import annotations

import json
from pathlib import Path

from bench_module import bench_module


def _bench():
    return bench_module("tune_sweep.py", "bench_tune_sweep")


def _rows(tmp_path: Path, built: dict[str, bool]) -> Path:
    rows = [{"arch": arch, "lever": None, "built": ok} for arch, ok in built.items()]
    rows.append({"arch": "opt", "lever": "ac-full", "built": None})
    path = tmp_path / "results.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_the_sample_is_seeded_and_holds_only_built_architectures_outside_the_zoo(tmp_path):
    bench = _bench()
    rows = _rows(tmp_path, {"opt": True, "bart/seq2seq": True, "clip": False, "llama": True,
                            "bert/causal-lm": True, "falcon": True, "xglm": True})
    three = bench.arch_sample(3, seed=5, rows_file=rows)
    assert three == bench.arch_sample(3, seed=5, rows_file=rows)
    everything = bench.arch_sample(10, seed=5, rows_file=rows)
    assert sorted(everything) == ["arch@bart/seq2seq", "arch@falcon", "arch@opt", "arch@xglm"]
    assert set(three) < set(everything)


def test_a_task_after_the_slash_is_the_arch_workloads_task():
    bench = _bench()
    assert bench.model_params("arch", "bart/seq2seq", "full", "cuda") == {
        "model": "bart", "task": "seq2seq", "size": "full", "device": "cuda"}
    assert bench.model_params("zoo", "gpt2", "tiny", "cpu") == {
        "model": "gpt2", "size": "tiny", "device": "cpu"}


def test_parts_deal_the_models_round_robin(capsys):
    bench = _bench()
    models = "zoo@a,zoo@b,zoo@c,zoo@d,zoo@e"
    dealt = []
    for part in range(2):
        assert bench.main(["--models", models, "--part", f"{part}/2", "--list"]) == 0
        dealt.append(capsys.readouterr().out.split())
    assert dealt == [["zoo@a", "zoo@c", "zoo@e"], ["zoo@b", "zoo@d"]]
