"""bench/tune_sweep.py's choice of models: the seeded sample beyond the zoo, tasks, parts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

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


def _prior(tmp_path: Path) -> Path:
    row = {"model": "zoo@nanogpt", "size": "tiny", "budget_s": 60.0, "stack": ["compile-blocks"],
           "tokens_per_s_ratio_ci95": [1.1, 1.2], "spent_s": 55.0, "trials": [{"stack": []}],
           "commit": "abc1234", "date": "2026-12-01", "call": "s39",
           "peers": {"compile-model": 1.3}, "vs_best_peer": 9.9}
    path = tmp_path / "prior.json"
    path.write_text(json.dumps({"rows": [row]}))
    return path


def test_retime_times_an_earlier_stack_beside_the_peers_and_names_the_peers_left_out(tmp_path):
    bench = _bench()
    out = tmp_path / "out"
    assert bench.main(["--models", "zoo@nanogpt", "--size", "tiny", "--device", "cpu",
                       "--budget", "60", "--peers", "compile-layers,compile-model-ro",
                       "--warmup", "1", "--steps", "2", "--retime", str(_prior(tmp_path)),
                       "--out", str(out)]) == 0
    [row] = json.loads((out / "summary.json").read_text())["rows"]
    # the search is the earlier one, with where it ran; nothing of its old timing survives
    assert row["stack"] == ["compile-blocks"] and row["spent_s"] == 55.0
    assert row["tokens_per_s_ratio_ci95"] == [1.1, 1.2] and row["trials"] == [{"stack": []}]
    assert row["searched"]["commit"] == "abc1234" and row["searched"]["call"] == "s39"
    assert row["peers_first_run"] == {"compile-model": 1.3}
    assert row["commit"] != "abc1234"
    # the zoo's family and shape, as the rows name them
    assert row["family"] == "decoder" and row["shape"]["width"] == 64
    assert row["shape"]["tokens_per_step"] > 0
    variants = {r["variant"]: r["status"] for r in row["rows"]}
    assert variants == {"default": "ok", "compile-layers": "ok",
                        "compile-model-ro": "not-applicable", "tuned": "ok"}
    assert set(row["peers"]) == {"compile-layers"} and row["best_peer"] == "compile-layers"
    assert row["vs_best_peer"] == row["same_run_ratio"] / row["peers"]["compile-layers"]
    missing = row["peers_missing"]
    assert missing["compile-model-ro"] == "reduce-overhead (CUDA graphs) needs a GPU"
    assert missing["compile-model"].startswith("not run")
    assert set(missing) == set(bench.PEERS) - {"compile-layers"}
    # then the stack and the best peer again, side by side, alternated step by step
    duel = row["head_to_head"]
    assert (duel["status"], duel["peer"]) == ("ok", "compile-layers") and duel["pairs"] >= 2
    assert row["vs_best_peer_paired"] == duel["ratio"] > 0
    low, high = row["vs_best_peer_paired_ci95"]
    assert low <= duel["ratio"] <= high


@pytest.mark.parametrize("searched_on, elsewhere", [
    (None, False), ("NVIDIA H100 80GB HBM3", False), ("NVIDIA H200", True)])
def test_a_stack_searched_on_another_gpu_says_so_when_retimed(monkeypatch, searched_on, elsewhere):
    bench = _bench()
    here = {"commit": "def5678", "torch": "2.11", "gpu": "NVIDIA H100 80GB HBM3", "date": "d"}
    monkeypatch.setattr(bench, "_environment", lambda: dict(here))
    row = {"model": "zoo@nanogpt", "size": "tiny", "budget_s": 60.0, "stack": [],
           "commit": "abc1234", **({"gpu": searched_on} if searched_on else {})}
    retimed = bench.retimed_row(row)
    assert retimed["gpu"] == here["gpu"] and retimed["searched"]["gpu"] == searched_on
    assert ("searched_elsewhere" in retimed) is elsewhere
    if elsewhere:
        assert "NVIDIA H200" in retimed["searched_elsewhere"]


def test_retime_without_an_earlier_row_stops_before_any_work(tmp_path, capsys):
    bench = _bench()
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as stop:
        bench.main(["--models", "zoo@nanogpt,zoo@gpt2", "--size", "tiny", "--device", "cpu",
                    "--budget", "60", "--retime", str(_prior(tmp_path)), "--out", str(out)])
    assert stop.value.code == 2
    assert "no row of zoo@gpt2" in capsys.readouterr().err
    assert not out.exists()


def test_a_model_outside_the_zoo_is_described_by_its_arch_entry_or_its_config():
    import levers

    bench = _bench()
    params = bench.model_params("arch", "bart/seq2seq", "tiny", "cpu")
    workload = levers.Step("arch", params=params).workload()
    described = bench.describe("arch", "bart", workload)
    assert described["family"] == "encoder-decoder"
    shape = described["shape"]
    assert shape["width"] == workload.model.config.d_model and shape["batch_size"] == 2
    assert shape["layers"] == workload.params["layers"]
    assert shape["tokens_per_step"] == workload.tokens_per_step
    # a spec of another kind: its head's family and its built config
    other = bench.describe("bench/outside_zoo.py:make", "bart", workload)
    assert other["family"] == "encoder-decoder"
    assert other["shape"]["model_type"] == "bart" and other["shape"]["batch_size"] == 2
    assert other["shape"]["tokens_per_step"] == workload.tokens_per_step


def test_a_row_cut_short_keeps_the_stacks_timing_marked_incomplete(tmp_path, monkeypatch):
    # the per-model timeout of a device session kills the process mid-row: what was timed by
    # then is on disk, the stack's own timing first after the default
    bench = _bench()
    out = tmp_path / "out"
    real = bench.timed_row
    order = []

    def cut(spec, params, variant, stack, args):
        if variant == "compile-model-ro":
            raise KeyboardInterrupt  # the timeout's kill, as the process sees it
        order.append(variant)
        return real(spec, params, variant, stack, args)

    monkeypatch.setattr(bench, "timed_row", cut)
    with pytest.raises(KeyboardInterrupt):
        bench.main(["--models", "zoo@nanogpt", "--size", "tiny", "--device", "cpu",
                    "--budget", "60", "--peers", "compile-layers,compile-model-ro",
                    "--warmup", "1", "--steps", "2", "--retime", str(_prior(tmp_path)),
                    "--out", str(out)])
    assert order == ["default", "tuned", "compile-layers"]
    [row] = json.loads((out / "summary.json").read_text())["rows"]
    assert row["incomplete"] == "not timed yet: compile-model-ro"
    assert [r["variant"] for r in row["rows"]] == order
    assert row["same_run_ratio"] > 0 and set(row["peers"]) == {"compile-layers"}


def test_a_step_out_of_the_gpus_memory_is_tuned_again_at_the_batch_levers_memory_fits(
        monkeypatch):
    from types import SimpleNamespace

    from levers.memory.plan import FitPoint, FitResult

    bench = _bench()
    asked = {}

    class Step:
        def __init__(self, spec, params):
            asked.update(spec=spec, params=params)

        def fit(self, param, gpu):
            asked.update(param=param, gpu=gpu)
            # as levers memory's fit of gemma3 at full for an H100 searched it on the CPU
            curve = tuple(FitPoint(b, 0, b * 2**30, b <= 4) for b in (1, 8, 6, 3, 5, 4))
            return FitResult(param, best=4, budget_bytes=0, margin=0.05, curve=curve)

    monkeypatch.setattr(bench.levers, "Step", Step)
    monkeypatch.setattr(bench.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(bench.torch.cuda, "get_device_properties",
                        lambda i: SimpleNamespace(total_memory=79.18 * 2**30))
    params = {"model": "gemma3", "size": "full", "device": "cuda"}
    oom = ("StepError: the step of workload 'arch-gemma3' ran out of the GPU's memory at its "
           "parameters (...)")
    fitted = bench.fit_batch("arch", params, oom)
    assert fitted["batch_size"] == 4 and fitted["from"] == 8 and fitted["gpu_gib"] == 79.2
    assert fitted["predicted_reserved_gib"][8] == 8.0
    assert asked == {"spec": "arch", "params": {"model": "gemma3", "size": "full"},
                     "param": "batch_size", "gpu": "79.2GiB"}
    # another error, or a batch the caller set, is left as it is
    assert bench.fit_batch("arch", params, "StepError: ... raised AcceleratorError") is None
    assert bench.fit_batch("arch", {**params, "batch_size": 8}, oom) is None


class _Side:
    """A built variant whose steps append its name to a shared log and take its own time."""

    def __init__(self, name, log, clock, step_s, tokens=100):
        self.name, self.log, self.clock, self.step_s = name, log, clock, step_s
        self.tokens_per_step = tokens
        self.device = __import__("torch").device("cpu")

    def step(self):
        self.log.append(self.name)
        self.clock.now += self.step_s


def test_head_to_head_alternates_the_stack_and_the_best_peer_step_by_step(monkeypatch):
    # a pair's order swaps each pair, so a drift lands on both; the ratio is of the medians
    from types import SimpleNamespace

    bench = _bench()
    log, clock = [], SimpleNamespace(now=0.0)
    speeds = {bench.TUNED: 0.010, "compile-model": 0.0125}
    undone = []

    def built(spec, params, variant, stack, cleanups):
        cleanups.append(lambda: undone.append(variant))
        return _Side(variant, log, clock, speeds[variant]), {}

    monkeypatch.setattr(bench, "_built", built)
    monkeypatch.setattr(bench.time, "perf_counter", lambda: clock.now)
    args = SimpleNamespace(warmup=1, steps=4, min_timed_s=0.0, debug=False)
    out = bench.head_to_head("zoo", {}, ["compile-model:mode=default"], "compile-model", args)
    assert out["status"] == "ok" and out["pairs"] == 4 and out["peer"] == "compile-model"
    timed = log[2:]  # after one warm-up step of each
    assert timed == [bench.TUNED, "compile-model", "compile-model", bench.TUNED] * 2
    assert abs(out["ratio"] - 1.25) < 1e-9 and out["ci95"][0] <= 1.25 <= out["ci95"][1]
    assert undone == ["compile-model", bench.TUNED]  # the peer's undo first, then the stack's


def test_head_to_head_on_cuda_alternates_windows_of_about_half_a_second(monkeypatch):
    # on CUDA a side that draws less power lends the other its clock when they alternate step
    # by step (s57): the two alternate in windows of steps there, as levers' A/Bs do
    from types import SimpleNamespace

    bench = _bench()
    log, clock = [], SimpleNamespace(now=0.0)
    speeds = {bench.TUNED: 0.1, "torchtitan-float8": 0.125}
    sides = {}

    def built(spec, params, variant, stack, cleanups):
        sides[variant] = _Side(variant, log, clock, speeds[variant])
        return sides[variant], {}

    monkeypatch.setattr(bench, "_built", built)
    monkeypatch.setattr(bench.time, "perf_counter", lambda: clock.now)
    monkeypatch.setattr(bench, "window_for", lambda device, window_s: window_s)
    args = SimpleNamespace(warmup=1, steps=20, min_timed_s=0.0, debug=False)
    out = bench.head_to_head("zoo", {}, ["compile-blocks", "float8"], "torchtitan-float8", args)
    # 0.5 s at the slower side's 0.125 s a step: windows of 4 steps, the order swapped each pair
    assert out["status"] == "ok" and out["pairs"] == 20 and out["window"] == 4
    t, p = bench.TUNED, "torchtitan-float8"
    assert log[2:] == ([t] * 4 + [p] * 4 + [p] * 4 + [t] * 4) * 2 + [t] * 4 + [p] * 4
    assert abs(out["ratio"] - 1.25) < 1e-9


def test_a_window_lasts_about_half_a_second_and_leaves_each_side_four():
    bench = _bench()
    assert bench.window_steps(0.5, 0.09, 33) == 6
    assert bench.window_steps(0.5, 0.09, 12) == 3  # a quarter of the pairs at most
    assert bench.window_steps(0.5, 2.0, 33) == 1  # a step longer than the window
    assert bench.window_steps(0.0, 0.09, 33) == 1  # off the GPU: step by step
    assert bench.window_steps(0.5, 0.0, 33) == 1


def test_head_to_head_of_a_peer_that_cannot_run_says_why():
    from types import SimpleNamespace

    bench = _bench()
    args = SimpleNamespace(warmup=1, steps=2, min_timed_s=0.0, debug=False)
    out = bench.head_to_head("zoo", bench.model_params("zoo", "nanogpt", "tiny", "cpu"), [],
                             "compile-model-ro", args)
    assert out == {"peer": "compile-model-ro", "status": "failed",
                   "error": "RuntimeError: reduce-overhead (CUDA graphs) needs a GPU"}


def test_rounds_time_every_variant_again_in_reversed_order_and_read_the_ratios_over_all(
        tmp_path):
    import statistics

    bench = _bench()
    out = tmp_path / "out"
    assert bench.main(["--models", "zoo@nanogpt", "--size", "tiny", "--device", "cpu",
                       "--budget", "60", "--peers", "compile-layers", "--rounds", "2",
                       "--no-head-to-head", "--warmup", "1", "--steps", "2",
                       "--min-timed-s", "0", "--retime", str(_prior(tmp_path)),
                       "--out", str(out)]) == 0
    [row] = json.loads((out / "summary.json").read_text())["rows"]
    assert [(r["variant"], r["round"]) for r in row["rows"]] == [
        ("default", 1), ("tuned", 1), ("compile-layers", 1),
        ("compile-layers", 2), ("tuned", 2), ("default", 2)]
    assert "incomplete" not in row
    pooled = {}
    for r in row["rows"]:
        pooled.setdefault(r["variant"], []).extend(r["tokens_per_s_samples"])
    med = statistics.median
    assert row["peers"]["compile-layers"] == pytest.approx(
        med(pooled["compile-layers"]) / med(pooled["default"]))
    assert row["same_run_ratio"] == pytest.approx(med(pooled["tuned"]) / med(pooled["default"]))
    assert {v: len(t) for v, t in row["rounds_tokens_per_s"].items()} == {
        "default": 2, "tuned": 2, "compile-layers": 2}
    for variant, per in row["rounds_tokens_per_s"].items():
        assert row["spread"][variant] == pytest.approx(max(per) / min(per) - 1.0)


def test_no_round_is_refused_before_any_work(tmp_path, capsys):
    with pytest.raises(SystemExit):
        _bench().main(["--models", "zoo@nanogpt", "--device", "cpu", "--rounds", "0",
                       "--out", str(tmp_path / "out")])
    assert "--rounds must be at least 1, got 0" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
