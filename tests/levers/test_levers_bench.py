"""bench/levers_vs_peers.py at tiny sizes on the CPU, and levers list reading what it wrote."""

from __future__ import annotations

import json

import pytest
from bench_module import bench_module

from levers.cli import main
from optional_deps import needs


def _bench():
    return bench_module("levers_vs_peers.py", "levers_vs_peers")


@pytest.mark.slow
@needs("transformers")
def test_smoke_run_writes_the_summary_and_a_catalogue_levers_list_reads(tmp_path, capsys):
    only = "llama:lever:rms-norm-fused,llama:lever:fused-optimizer,llama:liger"
    code = _bench().main(["--smoke", "--only", only, "--steps", "2", "--out", str(tmp_path / "s"),
                          "--catalogue-out", str(tmp_path / "c")])
    assert code == 0
    summary = json.loads((tmp_path / "s" / "summary.json").read_text())["rows"]
    by_variant = {row["variant"]: row for row in summary}
    assert set(by_variant) == {"default", "lever:rms-norm-fused", "lever:fused-optimizer", "liger"}
    default = by_variant["default"]
    for key in ("tokens_per_s", "tokens_per_s_ci95", "batch_size", "commit", "torch", "gpu", "shape"):
        assert key in default, key
    assert default["batch_size"] == 2 and len(default["dur_s"]) == 2
    assert by_variant["lever:fused-optimizer"]["status"] == "not-applicable"
    assert by_variant["liger"]["status"] == "failed"  # not installed here: an honest row
    capsys.readouterr()
    assert main(["list", "--json", "--catalogue", str(tmp_path / "c" / "catalogue.json")]) == 0
    listed = {item["id"]: item for item in json.loads(capsys.readouterr().out)["levers"]}
    measured = listed["rms-norm-fused"]["measured"]
    assert len(measured) == 1 and measured[0]["status"] == "ok"
    assert measured[0]["tokens_per_s_ratio"] > 0 and measured[0]["torch"]
    assert listed["fused-optimizer"]["measured"][0]["effect"] == "failed"
    assert listed["compile-blocks"]["measured"] == []


def test_levers_list_shows_effects_negatives_and_not_measured(tmp_path, capsys):
    rows = [
        {"lever": "compile-blocks", "workload": "hf", "shape": "arch=llama size=1b",
         "baseline": "llama:default", "status": "ok", "tokens_per_s_ratio": 1.5,
         "tokens_per_s_ratio_ci95": [1.48, 1.52], "peak_allocated_delta_bytes": -2 * 2**30,
         "peak_allocated_delta_ci95": [-2.1 * 2**30, -1.9 * 2**30],
         "peak_reserved_delta_bytes": -2**30},
        {"lever": "compile-blocks", "workload": "zoo", "shape": "model=bert size=full",
         "baseline": "zoo:default", "status": "ok", "tokens_per_s_ratio": 0.9,
         "tokens_per_s_ratio_ci95": [0.85, 0.95]},
        {"lever": "compile-blocks", "workload": "zoo", "shape": "model=vit size=full",
         "baseline": "zoo:default", "status": "ok", "tokens_per_s_ratio": 1.2,
         "tokens_per_s_ratio_ci95": [1.1, 1.3]},
        {"lever": "rms-norm-fused", "workload": "hf", "shape": "arch=llama size=1b",
         "baseline": "llama:default", "status": "ok", "tokens_per_s_ratio": 0.99,
         "tokens_per_s_ratio_ci95": [0.97, 1.01]},
        {"lever": "sdpa-cudnn-backend", "workload": "hf", "shape": "s", "baseline": "b",
         "status": "ok", "tokens_per_s_ratio": 0.9, "tokens_per_s_ratio_ci95": [0.88, 0.92]},
        {"lever": "liger-kernels", "workload": "hf", "shape": "s", "baseline": "b",
         "status": "failed", "error": "BackendCompilerFailed: dynamo"},
        {"lever": "llama:levers-stack", "workload": "hf", "shape": "s", "baseline": "b",
         "status": "ok", "tokens_per_s_ratio": 1.7, "tokens_per_s_ratio_ci95": [1.6, 1.8]},
    ]
    path = tmp_path / "catalogue.json"
    path.write_text(json.dumps({"rows": rows, "gpu": "NVIDIA H200", "torch": "2.11.0",
                                "commit": "abc1234567", "date": "2026-12-01"}))
    assert main(["list", "--catalogue", str(path)]) == 0
    out = capsys.readouterr().out
    assert "1.50x tokens/s [1.48, 1.52] (faster), peak allocated -2.0 GiB [-2.1, -1.9]" in out
    assert "0.99x tokens/s [0.97, 1.01] (no effect)" in out
    assert "0.90x tokens/s [0.88, 0.92] (slower)" in out
    assert "FAILED (BackendCompilerFailed: dynamo)" in out
    assert "NVIDIA H200, torch 2.11.0, commit abc1234567, 2026-12-01" in out
    assert "windowed-peak-metric" in out and "measured: not measured" in out
    assert "llama:levers-stack: 1.70x" in out
    # a lever with several timed rows opens with their summary; one with a single row does not
    assert ("measured on 3 timed rows: 2 faster, 0 no effect, 1 slower; tokens/s 0.90x-1.50x, "
            "median 1.20x") in out
    assert out.count("timed rows:") == 1
    assert main(["list", "--catalogue", str(tmp_path / "missing.json")]) == 2


def test_a_row_measured_on_top_of_another_is_catalogued_against_it():
    import random

    def row(variant, levers, tokens, **extra):
        return {"group": "llama", "variant": variant, "levers": levers, "workload": "hf",
                "status": "ok", "tokens_per_s_samples": tokens, **extra}

    rows = [
        row("default", [], [100.0, 101.0, 99.0]),
        row("lever:compile-blocks", ["compile-blocks"], [150.0, 151.0, 149.0]),
        row("lever:float8", ["float8", "compile-blocks"], [165.0, 166.0, 164.0],
            baseline_variant="lever:compile-blocks"),
    ]
    entries = {e["lever"]: e for e in _bench().catalogue_rows(rows, random.Random(0))}
    assert entries["compile-blocks"]["baseline"] == "llama:default"
    assert entries["compile-blocks"]["tokens_per_s_ratio"] == 1.5
    float8 = entries["float8"]
    assert (float8["baseline"], float8["levers"]) == ("llama:lever:compile-blocks", ["float8"])
    assert float8["tokens_per_s_ratio"] == 165.0 / 150.0


def test_the_float8_rows_run_only_when_named_and_on_top_of_compile_blocks():
    variants = _bench().variants_of("llama", smoke=True)
    for name in ("lever:float8", "lever:float8-rowwise", "torchtitan-float8", "levers-stack+float8"):
        assert variants[name]["optional"], name
    assert variants["lever:float8"]["levers"] == ["float8", "compile-blocks"]
    assert variants["lever:float8-rowwise"]["baseline"] == "lever:compile-blocks"


def test_the_goal_table_times_the_peers_at_the_batches_a_user_would_pick():
    bench = _bench()
    variants = bench.variants_of("qwen2", smoke=True)
    assert variants["torchtitan-float8+liger-flce"]["peer"] == (
        "liger-flce+float8-torchtitan+compile-layers"
    )
    for batch in bench.PEER_BATCHES:
        row = variants[f"torchtitan-float8+liger-flce@b{batch}"]
        assert row["params"] == {"batch_size": batch} and row["optional"]
    assert variants["levers-stack+float8+raise-batch"]["raise_batch"]
    assert variants["levers-stack+float8+raise-batch"]["levers"][0] == "float8"


def test_a_peer_is_its_transforms_in_order_and_an_unknown_one_is_refused():
    from levers.loader import load_workload

    bench = _bench()
    workload = load_workload("hf", {"arch": "llama", "size": "tiny"})
    compiled = []
    bench._compile_layers = lambda w, options: compiled.append(options)
    assert bench.apply_peer("compile-layers", workload, {"backend": "aot_eager", "mode": "x"}) == []
    assert compiled == [{"backend": "aot_eager"}]  # only the backend reaches a peer's compile
    with pytest.raises(ValueError, match="unknown peer transform 'liger-all'"):
        bench.apply_peer("compile-layers+liger-all", workload, {})


def test_the_vit_group_sets_levers_beside_the_three_ways_users_compile_it():
    bench = _bench()
    variants = bench.variants_of("vit", smoke=False)
    assert {"compile-layers", "compile-model", "compile-model-ro"} == {
        spec["peer"] for spec in variants.values() if spec.get("peer")
    }
    assert variants["lever:compile-model"]["levers"] == ["compile-model"]
    assert variants["levers-stack"]["levers"] == list(bench.VIT_STACK)
    assert variants["levers-stack+sdpa-cudnn"]["optional"]
    workload, params = bench.group_params("vit", smoke=False, device="cuda")
    assert (workload, params["model"], params["size"]) == ("zoo", "timm-vit", "full")


@pytest.mark.slow
@needs("transformers")
def test_smoke_run_of_the_vit_group_records_the_mode_compile_model_chose(tmp_path):
    only = "vit:compile-model-ro,vit:lever:compile-model"
    code = _bench().main(["--smoke", "--only", only, "--steps", "2", "--out", str(tmp_path / "s"),
                          "--catalogue-out", str(tmp_path / "c")])
    assert code == 0
    summary = json.loads((tmp_path / "s" / "summary.json").read_text())["rows"]
    by_variant = {row["variant"]: row for row in summary}
    assert set(by_variant) == {"default", "compile-model-ro", "lever:compile-model"}
    assert all(row["status"] == "ok" for row in summary), summary
    lever = by_variant["lever:compile-model"]
    assert lever["applied"] == ["compile-model"]
    # on a CPU compile-model's mode=auto keeps inductor's default mode, and says why
    assert lever["compile_model_mode"] == "default"
    assert "on a GPU" in lever["compile_model_reasons"][0]
    # the same seed, the same steps: the compiled rows' loss is the default's, within tolerance
    default_loss = by_variant["default"]["last_loss"]
    assert all(row["last_loss"] == pytest.approx(default_loss, rel=1e-5) for row in summary)


def test_the_compiled_loss_peer_compiles_a_hf_models_loss_and_its_cleanup_gives_it_back():
    from levers.loader import load_workload

    bench = _bench()
    workload = load_workload("hf", {"arch": "llama", "size": "tiny"})
    model = workload.model
    cleanups = bench.apply_peer("compile-loss", workload, {"backend": "aot_eager"})
    assert len(cleanups) == 1
    assert "_loss_function" in vars(model)  # transformers' loss, compiled
    assert model.loss_function._torchdynamo_orig_callable.__name__ == "ForCausalLMLoss"
    cleanups[0]()
    assert "_loss_function" not in vars(model)
    assert model.loss_function.__name__ == "ForCausalLMLoss"
