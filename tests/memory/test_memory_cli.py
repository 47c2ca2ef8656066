"""``levers memory`` end to end on the CPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from levers.cli import main

FACTORIES = Path(__file__).parent / "memory_factories.py"
MIB = 1 << 20


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["memory", *argv])
    out, err = capsys.readouterr()
    # rich wraps long lines at the console width: compare with whitespace collapsed
    return code, " ".join(out.split()), " ".join(err.split())


def test_prediction_attribution_and_json(capsys, tmp_path):
    out_file = tmp_path / "plan.json"
    code, out, err = run(
        capsys, f"{FACTORIES}:mlp", "--gpu", "h100-80gb", "--steps", "2", "--json", str(out_file)
    )
    assert code == 0, err
    for text in (
        "FITS",
        "max_memory_allocated",
        "65.0 MiB",
        "The peak: step 1 backward",
        "What-ifs",
        "bf16-optimizer-states",
    ):
        assert text in out
    plan = json.loads(out_file.read_text())
    assert plan["peak_allocated_bytes"] == 68176896
    assert plan["peak_reserved_bytes"] == 66 * MIB
    assert plan["gpu"]["name"] == "h100-80gb" and plan["fits"] is True
    assert {c["category"] for c in plan["by_category"]} >= {"parameters", "gradients", "optimizer"}


def test_fit_prints_the_curve(capsys):
    code, out, err = run(
        capsys,
        f"{FACTORIES}:stack",
        "--set",
        "batch_size=256",
        "width=1024",
        "depth=2",
        "--gpu",
        "0.6GiB",
        "--fit",
        "batch_size",
        "--no-whatifs",
        "--steps",
        "1",
    )
    assert code == 0, err
    assert "--fit batch_size: largest that fits = " in out
    assert "yes" in out and "no" in out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--gpu", "b300"], "not a known GPU"),
        (["--margin", "1.5"], "margin must be in [0, 1)"),
        (["--fit", "batch_size", "--set", "batch_size=2.5"], "not a positive integer"),
        (["--measure"], "needs a CUDA GPU"),
        (["--lever", "compile-everything"], "--lever: unknown lever(s) compile-everything"),
        (["--lever", "compile-blocks", "--world-size", "2"], "run --fit, --measure and --lever"),
    ],
)
def test_user_errors_say_what_to_do(capsys, argv, message):
    code, _out, err = run(capsys, f"{FACTORIES}:mlp", "--no-whatifs", "--steps", "1", *argv)
    assert code == 2
    assert message in err


def test_a_lever_is_predicted_with_the_step(capsys, tmp_path):
    # issue 21: the step that will run, blocks compiled; the plan says how it was predicted
    pytest.importorskip("transformers")
    plans = {}
    for name, extra in (("eager", ()), ("compiled", ("--lever", "compile-blocks"))):
        out_file = tmp_path / f"{name}.json"
        code, out, err = run(
            capsys, "hf", "--set", "arch=llama", "--set", "size=tiny", "--set", "batch_size=8",
            "--gpu", "h200", "--steps", "2", "--no-whatifs", "--json", str(out_file), *extra,
        )  # fmt: skip
        assert code == 0, err
        plans[name] = json.loads(out_file.read_text())
    assert any("min-cut rematerialization" in a for a in plans["compiled"]["assumptions"])
    assert not any("min-cut" in a for a in plans["eager"]["assumptions"])

    def first_block(plan) -> int:
        by_module = {m["module"]: m["nbytes"] for m in plan["activations_by_module"]}
        return by_module["model.layers.0"]

    # at the peak (step 1's backward) the block keeps less compiled: inductor's partition
    # recomputes elementwise ops (0.96 MiB against 1.58 MiB at batch 8; no causal mask in either,
    # as on a GPU: the batch has no padding)
    assert first_block(plans["compiled"]) == 1004544
    assert first_block(plans["eager"]) == 1659904


def test_measure_runs_the_step_with_the_levers_the_prediction_applied(capsys, monkeypatch):
    # the measured step beside a compiled prediction must be the compiled step too
    from levers.api import Step
    from levers.memory.plan import Measured

    asked = []

    def measure_memory(self, *, num_steps=None, lever_ids=()):
        asked.append(list(lever_ids))
        return Measured("a GPU", 1, 2, num_steps, "torch")

    monkeypatch.setattr(Step, "measure_memory", measure_memory)
    code, _, err = run(
        capsys, "llama", "--set", "size=tiny", "--steps", "1", "--no-whatifs", "--measure",
        "--lever", "rms-norm-fused,fused-optimizer",
    )  # fmt: skip
    assert code == 0, err
    assert asked == [["rms-norm-fused", "fused-optimizer"]]


@pytest.mark.slow
def test_llama_8b_on_an_h100_runs_on_this_machine_and_does_not_fit(capsys):
    code, out, err = run(capsys, "llama", "--set", "size=8b", "--gpu", "h100-80gb")
    assert code == 0, err
    assert "DOES NOT FIT" in out
    assert "8.03B parameters" in out
    assert "blocks.31" in out or "… " in out  # the attribution by block is printed
    assert "activation-checkpointing" in out


def test_fit_defaults_to_the_batch_size(capsys):
    code, out, err = run(
        capsys,
        f"{FACTORIES}:stack",
        "--set",
        "batch_size=256",
        "width=1024",
        "depth=2",
        "--fit",
        "--gpu",
        "0.6GiB",
        "--no-whatifs",
        "--steps",
        "1",
    )
    assert code == 0, err
    assert "--fit batch_size: largest that fits = " in out


def test_a_batch_too_large_for_the_host_is_refused_before_allocating(capsys):
    # the demo's layout is built in Python on the host, fake tensors or not: 10**10 samples
    # used to allocate 10 GB and hang; it is refused first, with the largest batch it takes
    code, _out, err = run(capsys, "demo", "--set", "batch_size=10000000000", "--no-whatifs")
    assert code == 2
    assert "use batch_size <= " in err


def test_the_fit_brackets_the_budget_and_says_when_it_stopped(capsys):
    code, out, err = run(
        capsys, f"{FACTORIES}:stack", "--set", "batch_size=256", "width=1024", "depth=2",
        "--gpu", "0.6GiB", "--fit", "--no-whatifs", "--steps", "1",
    )
    assert code == 0, err
    line = next(l for l in out.splitlines() if "largest that fits" in l)
    # the search closed (one that fits, the next one up does not), so no "at least"
    assert "at least" not in line
