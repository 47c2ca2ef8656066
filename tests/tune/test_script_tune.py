"""``levers tune -- python train.py`` end to end on the CPU: the fixture scripts run unchanged,
each side of each A/B a fresh run of the script (a few seconds each), with a small design. What
is asserted is behaviour (the runs, parity, the record, the refusals), never a speed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from levers.cli import main
from tests.integrations.conftest import SCRIPTS, needs

LOOP = str(SCRIPTS / "train_loop.py")
TRAINER = str(SCRIPTS / "train_trainer.py")
# 2 script steps before the levers, 1 after, then 2 timed per run (--steps 4 over 2 rounds)
SMALL = ["--steps", "4", "--warmup", "1", "--parity-steps", "2", "--resamples", "200",
         "--no-audit", "--budget", "15m"]
pytestmark = pytest.mark.slow


def _events(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _confirmed_where_it_paid(events: list[dict]) -> None:
    """A one-lever search's record: its selection A/B, then a fresh confirmation of the same
    stack against the baseline where the selection paid, then the result."""
    trials = events[:-1]
    assert trials[0]["role"] == "selection"
    assert len(trials) == (2 if trials[0]["pays"] else 1), [t["why"] for t in trials]
    if len(trials) == 2:
        assert trials[1]["role"] == "confirmation" and trials[1]["base"] == []
        assert trials[1]["stack"] == trials[0]["stack"]


def test_the_plain_loop_is_tuned_end_to_end(capsys, tmp_path):
    record, out_json = tmp_path / "tune.jsonl", tmp_path / "tune.json"
    code = main(["tune", *SMALL, "--lever", "ac-full,windowed-peak-metric", "--record",
                 str(record), "--json", str(out_json), "--", "python", LOOP, "--steps", "30"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"levers tune -- python {LOOP} --steps 30 on cpu" in out
    assert "windowed-peak-metric: does not apply: it wraps the training step" in out
    events = _events(record)
    # ac-full's selection A/B, and a fresh one to confirm it where the first paid
    assert [e["event"] for e in events] in (["tune-trial", "tune-result"],
                                            ["tune-trial"] * 2 + ["tune-result"])
    _confirmed_where_it_paid(events)
    trial = events[0]
    assert trial["stack"] == ["ac-full"] and trial["script"][1] == LOOP
    # ac-full is exact and the script is seeded: its losses are the baseline's
    assert trial["parity"] == "PARITY", trial["parity_note"]
    assert "steps 3-4 of the script agree" in trial["parity_note"]
    low, high = trial["tokens_per_s_ci95"]
    assert low <= trial["tokens_per_s_ratio"] <= high
    assert "2 run(s) of each side, alternating; 4 paired steps" in trial["warnings"][0]
    result = json.loads(out_json.read_text())
    assert result["rounds"] == 2 and result["ab_command"] is None
    if result["stack"]:  # never slower than the baseline
        assert result["proof"]["tokens_per_s_ci95"][0] > 1.0
        assert "levers tune --lever ac-full" in result["reproduce_command"]
    else:
        assert "nothing pays here" in out


def test_a_script_that_fails_before_its_steps_is_refused_with_its_error(capsys):
    code = main(["tune", *SMALL, "--", "python", LOOP, "--fail-at-step", "1"])
    err = capsys.readouterr().err
    assert code == 3
    assert "failed before levers tune could time its steps (after 1 optimizer step(s))" in err
    assert "RuntimeError: data shard missing at step 1" in err


def test_a_script_that_ends_before_its_steps_says_how_many_it_needs(capsys):
    code = main(["tune", *SMALL, "--", "python", LOOP, "--steps", "3"])
    err = capsys.readouterr().err
    assert code == 2
    assert "ended after 3 optimizer step(s); levers tune runs it to step 5" in err


@needs("accelerate")
@needs("transformers")
def test_the_trainer_script_goes_through_a_trial(capsys, tmp_path):
    record = tmp_path / "tune.jsonl"
    code = main(["tune", *SMALL, "--rounds", "1", "--lever", "ac-full", "--record", str(record),
                 "--", "python", TRAINER, "--max-steps", "12", "--output-dir",
                 str(tmp_path / "run")])
    out = capsys.readouterr().out
    assert code == 0, out
    events = _events(record)
    _confirmed_where_it_paid(events)
    trial, result = events[0], events[-1]
    assert trial["stack"] == ["ac-full"] and trial["error"] is None
    assert trial["parity"] == "PARITY", trial["parity_note"]
    assert "LlamaForCausalLM" in " ".join(result["notes"])
