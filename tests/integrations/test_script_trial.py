"""The trial child of ``levers tune -- python train.py`` (``python -m
levers.cli.script_trial``): one run of an unchanged script, the levers applied inside it
after its warm-up steps, and the JSON it writes. Each test runs the plain-loop fixture script in
a fresh process, as levers tune does."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from tests.integrations.conftest import REPO, SCRIPTS

LOOP = SCRIPTS / "train_loop.py"
pytestmark = pytest.mark.slow


def _side(tmp_path, *options: str, script_args: tuple[str, ...] = ("--steps", "20")) -> dict:
    out = tmp_path / "side.json"
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    done = subprocess.run(
        [sys.executable, "-m", "levers.cli.script_trial", "--out", str(out),
         "--warmup", "2", "--compile-steps", "1", "--steps", "3", *options,
         "--", "python", str(LOOP), *script_args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(out.read_text())
    data["stdout"] = done.stdout
    return data


def test_the_probe_finds_the_model_says_what_applies_and_records_its_steps(tmp_path):
    data = _side(tmp_path, "--probe")
    assert data["complete"] is True
    assert (data["model"], data["optimizer"], data["device"]) == ("TinyLM", "AdamW", "cpu")
    assert data["param_dtype"] == "float32" and data["autocast"] is None
    assert data["applied"] == []
    # 1 compile warm-up step + 3 timed; the losses are the script's own, as it prints them
    assert len(data["step_s"]) == 3 and all(t > 0 for t in data["step_s"])
    assert len(data["losses"]) == 4
    printed = [line.split()[-1] for line in data["stdout"].splitlines() if line.startswith("step ")]
    # the script prints step i (0-based) after optimizer step i + 1; the losses are of steps 3..6
    # and it was stopped inside optimizer step 6, before its print
    assert len(printed) == 5
    assert [f"{loss:.4f}" for loss in data["losses"][:3]] == printed[2:]
    assert data["num_steps"] == 6 and data["peak_allocated_bytes"] is None  # no GPU
    applies = data["applies"]
    assert applies["ac-full"] is None and applies["rms-norm-fused"] is None
    assert applies["windowed-peak-metric"].startswith("it wraps the training step")
    assert "no recognised" in applies["fused-linear-cross-entropy"]


def test_a_side_applies_its_levers_in_the_running_script_and_keeps_its_losses(tmp_path):
    base = _side(tmp_path)
    side = _side(tmp_path, "--levers", "rms-norm-fused,compile-blocks:backend=eager")
    assert side["complete"] is True
    assert side["applied"] == ["rms-norm-fused", "compile-blocks"]
    assert "applies" not in side  # only the probe checks every lever
    for a, b in zip(base["losses"], side["losses"], strict=True):
        assert math.isclose(a, b, rel_tol=1e-5)


def test_a_lever_that_does_not_apply_ends_the_run_with_its_reason(tmp_path):
    side = _side(tmp_path, "--levers", "sdpa-attention")
    assert side["complete"] is False
    assert side["error"].startswith("lever sdpa-attention does not apply")
    assert side["num_steps"] == 2  # applied at the end of the warm-up


def test_a_script_that_fails_says_so_in_its_json(tmp_path):
    side = _side(tmp_path, script_args=("--steps", "20", "--fail-at-step", "1"))
    assert side["complete"] is False
    assert side["script_error"] == "RuntimeError: data shard missing at step 1"
    assert side["exit_code"] == 1 and side["num_steps"] == 1
