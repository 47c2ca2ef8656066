"""The run of ``levers tune -- python train.py`` (``python -m levers.cli.script_trial``): one run
of an unchanged script, the two sides of an A/B in alternating windows of its steps, and the
JSON it writes. Each test runs a fixture script in a fresh process, as levers tune does."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys

import pytest

from tests.integrations.conftest import REPO, SCRIPTS

LOOP = SCRIPTS / "train_loop.py"
WINDOWS = SCRIPTS / "train_windows.py"  # registers the planted levers test-mark, test-scale-loss
# 2 script steps before the levers, 2 parity steps, windows of 1 untimed + 2 timed steps
DESIGN = ("--warmup", "2", "--parity-steps", "2", "--compile-steps", "1", "--steps", "2")
pytestmark = pytest.mark.slow
needs_compiler = pytest.mark.skipif(
    shutil.which("g++") is None and shutil.which("c++") is None,
    reason="inductor on the CPU needs a C++ compiler",
)


def _run(tmp_path, *options: str, script=LOOP, script_args: tuple[str, ...] = ("--steps", "40"),
         name: str = "run") -> dict:
    out = tmp_path / f"{name}.json"
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    done = subprocess.run(
        [sys.executable, "-m", "levers.cli.script_trial", "--out", str(out), *DESIGN, *options,
         "--", "python", str(script), *script_args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(out.read_text())
    assert data["schema"] == 2
    data["stdout"] = done.stdout
    return data


def test_the_probe_finds_the_model_says_what_applies_and_records_its_parity_steps(tmp_path):
    data = _run(tmp_path, "--probe", "--rounds", "0")
    assert data["complete"] is True
    assert (data["model"], data["optimizer"], data["device"]) == ("TinyLM", "AdamW", "cpu")
    # the script's own names for them, for tune's apply line
    assert (data["names"]["model"], data["names"]["optimizer"]) == ("model", "optimizer")
    assert data["param_dtype"] == "float32" and data["autocast"] is None
    assert [(w["side"], w["stack"], w["applied"]) for w in data["windows"]] == [
        ("candidate", [], [])
    ]
    # the losses of steps 3 and 4 are the script's own, as it prints them (it prints a step's
    # loss after its optimizer step, and was stopped inside step 4, before that print)
    printed = [line.split()[-1] for line in data["stdout"].splitlines() if line.startswith("step ")]
    assert len(printed) == 3 and len(data["parity_losses"]) == 2
    assert f"{data['parity_losses'][0]:.4f}" == printed[2]
    assert data["num_steps"] == 4
    assert data["forward_draws_random"] is False  # its batches are drawn outside the model
    applies = data["applies"]
    assert applies["ac-full"] is None and applies["rms-norm-fused"] is None
    assert applies["windowed-peak-metric"].startswith("it wraps the training step")
    assert "no recognised" in applies["fused-linear-cross-entropy"]
    assert data["forms"] == {}  # compile-model's other mode is a GPU's


@pytest.mark.parametrize("dropout, drawn", [("0.1", True), ("0.0", False)])
def test_the_probe_sees_whether_the_model_s_forward_draws_random_numbers(tmp_path, dropout,
                                                                         drawn):
    data = _run(tmp_path, "--probe", "--rounds", "0", script=WINDOWS,
                script_args=("--steps", "40", "--dropout", dropout))
    assert data["forward_draws_random"] is drawn


def test_the_windows_alternate_and_the_baseline_runs_with_the_levers_undone(tmp_path):
    marks = tmp_path / "marks.txt"
    data = _run(tmp_path, "--candidate", "test-mark", "--rounds", "2", script=WINDOWS,
                script_args=("--steps", "40", "--marks", str(marks)))
    assert data["complete"] is True, data.get("error")
    assert [(w["side"], w["applied"], len(w["step_s"])) for w in data["windows"]] == [
        ("candidate", ["test-mark"], 2), ("baseline", [], 2),
        ("baseline", [], 2), ("candidate", ["test-mark"], 2),
    ]
    assert len(data["parity_losses"]) == 2
    # what the script's own forward hook saw, step by step: unmarked before the levers (steps
    # 1-2), marked through the candidate's window (2 parity + 1 untimed + 2 timed), unmarked in
    # the baseline's two (1 + 2, then 2 straight on), marked again (1 + 2); it was stopped inside
    # step 15, before writing its mark
    seen = [int(line.split()[1]) for line in marks.read_text().splitlines()]
    assert seen == [0, 0] + [1] * 5 + [0] * 3 + [0] * 2 + [1] * 2
    assert data["num_steps"] == 15
    assert set(data["phase_s"]) == {"script_start", "parity", "windows"}


def test_a_correct_stack_keeps_the_losses_of_the_parity_steps(tmp_path):
    plain = _run(tmp_path, "--rounds", "0", name="plain")
    side = _run(tmp_path, "--candidate", "rms-norm-fused,compile-blocks:backend=eager",
                "--rounds", "2", "--draws-random", "no", name="side")
    assert side["complete"] is True, side.get("error")
    windows = side["windows"]
    assert windows[0]["applied"] == ["rms-norm-fused", "compile-blocks"]
    # applied again after its undo (its last window), the stack reuses what dynamo compiled in
    # its first window
    assert [w["side"] for w in windows] == ["candidate", "baseline", "baseline", "candidate"]
    assert windows[3]["applied"] == ["rms-norm-fused", "compile-blocks"]
    assert windows[0]["compiled_frames"] > 0
    assert [w["compiled_frames"] for w in windows[1:]] == [0, 0, 0]
    # compiled while the parity steps drew alike, but the model draws no random numbers: the
    # programs are the user's either way, and kept
    assert side["random"]["compiled_graphs"] > 0 and side["random"]["recompiled"] is False
    assert "applies" not in side  # only the probe checks every lever
    for a, b in zip(plain["parity_losses"], side["parity_losses"], strict=True):
        assert math.isclose(a, b, rel_tol=1e-5)


@needs_compiler
def test_a_compiled_dropout_takes_eager_s_masks_and_is_compiled_again_for_timing(tmp_path):
    args = ("--steps", "40", "--dropout", "0.1")
    plain = _run(tmp_path, "--rounds", "0", script=WINDOWS, script_args=args, name="plain")
    side = _run(tmp_path, "--candidate", "compile-blocks", "--rounds", "1", "--draws-random",
                "yes", script=WINDOWS, script_args=args, name="side")
    assert side["complete"] is True, side.get("error")
    # inductor drew the masks with eager's random ops while the parity steps ran
    for a, b in zip(plain["parity_losses"], side["parity_losses"], strict=True):
        assert math.isclose(a, b, rel_tol=1e-6)
    assert side["random"]["compiled_graphs"] > 0
    # and what it compiled so was dropped: the timed steps run inductor's own random numbers
    assert side["random"]["recompiled"] is True


def test_a_lever_that_does_not_apply_ends_the_run_with_its_reason(tmp_path):
    side = _run(tmp_path, "--candidate", "sdpa-attention")
    assert side["complete"] is False
    assert side["error"].startswith("lever sdpa-attention does not apply")
    assert side["failed_side"] == "candidate"
    assert side["num_steps"] == 2  # applied at the end of the script's warm-up


def test_a_script_that_fails_says_so_in_its_json(tmp_path):
    side = _run(tmp_path, "--candidate", "ac-full",
                script_args=("--steps", "20", "--fail-at-step", "4"))
    assert side["complete"] is False
    assert side["script_error"] == "RuntimeError: data shard missing at step 4"
    assert side["exit_code"] == 1 and side["num_steps"] == 4
    assert side["failed_side"] == "candidate"  # its window was on


def test_a_window_that_hits_dynamo_s_recompile_limit_ends_the_run(tmp_path):
    # the blocks' tag changes every step and dynamo guards it by value: a recompile per step,
    # and past the limit the blocks would run uncompiled in the candidate's timed steps
    side = _run(tmp_path, "--candidate", "compile-blocks:backend=eager", "--rounds", "1",
                "--steps", "8", script=WINDOWS, script_args=("--steps", "60", "--retag"))
    assert side["complete"] is False
    assert side["error"].startswith("dynamo hit its recompile limit (8)")
    assert "compile-blocks:backend=eager was on (the candidate's window 1)" in side["error"]
    assert side["failed_side"] == "candidate"
    assert side["windows"][0]["recompile_limit_hits"] >= 1
