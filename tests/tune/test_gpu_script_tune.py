"""``levers tune -- python train.py`` on a GPU: the plain-loop fixture on CUDA, its levers
applied inside each run (compile-model's CUDA graphs included), the peak measured."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from levers.cli import main
from levers.tune.measure import TrialDesign
from levers.tune.script import ScriptDesign, subprocess_runner
from tests.integrations.conftest import SCRIPTS

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
LOOP = ["python", str(SCRIPTS / "train_loop.py"), "--steps", "60", "--dim", "512", "--depth",
        "4", "--seq-len", "512", "--batch-size", "8", "--vocab", "8192"]


def test_a_run_on_the_gpu_applies_compile_model_in_its_windows_and_measures_its_peak(tmp_path):
    design = ScriptDesign(TrialDesign(steps=10, warmup=3, parity_steps=2), rounds=2)
    run = subprocess_runner(LOOP, design, tmp_path)
    base = run((), (), 300.0, probe=True)
    side = run(("compile-model",), (), 300.0, draws_random=base.data["forward_draws_random"])
    assert base.complete and side.complete, (base.error, side.log_tail)
    assert base.data["device"].startswith("cuda") and base.data["applies"]["compile-model"] is None
    windows = side.data["windows"]
    assert [(w["side"], w["applied"]) for w in windows] == [
        ("candidate", ["compile-model"]), ("baseline", []), ("baseline", []),
        ("candidate", ["compile-model"]),
    ]
    assert all(w.peak_allocated_bytes > 0 for w in side.windows)
    assert all(len(w.step_s) == design.timed_per_window for w in side.windows)
    # compile-model applied again after its undo reuses its programs (and its CUDA graphs)
    assert windows[0]["compiled_frames"] > 0 and windows[3]["compiled_frames"] == 0
    assert all(w["recompile_limit_hits"] == 0 for w in windows)
    # compiled in fp32: the losses of the parity steps within compile-model's tolerance class
    for a, b in zip(base.parity_losses, side.parity_losses, strict=True):
        assert math.isclose(a, b, rel_tol=1e-3)


def test_tune_of_the_loop_on_the_gpu_returns_a_proven_stack_or_nothing(capsys, tmp_path):
    record, out_json = tmp_path / "r.jsonl", tmp_path / "t.json"
    code = main(["tune", "--budget", "2m", "--steps", "10",
                 "--lever", "compile-blocks,compile-model,fused-optimizer", "--record", str(record),
                 "--json", str(out_json), "--", *LOOP])
    out = capsys.readouterr().out
    print(out)
    assert code == 0
    result = json.loads(Path(out_json).read_text())
    assert result["device"].startswith("cuda")
    if result["stack"]:
        assert result["proof"]["tokens_per_s_ci95"][0] > 1.0
        assert result["proof"]["parity"] == "PARITY"
        assert result["proof"]["peak_allocated_bytes"] is not None
    for trial in result["trials"]:
        assert trial["parity"] != "PARITY" or "agree within" in trial["parity_note"]
