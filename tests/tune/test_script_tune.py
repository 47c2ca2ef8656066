"""``levers tune -- python train.py`` end to end on the CPU: the fixture scripts run unchanged,
each A/B one run of the script (a few seconds each) with its sides in alternating windows, with a
small design. What is asserted is behaviour (the runs, parity, the record, the refusals), never a
speed."""

from __future__ import annotations

from dataclasses import replace

import importlib.util
import json
from pathlib import Path

import pytest

from levers.ab.verdict import DAMAGED, NOT_MEASURED, PARITY
from levers.cli import main
from levers.levers import load_all
from levers.tune.measure import TrialDesign
from levers.tune.options import TuneOptions
from levers.tune.script import (
    NOT_REPEATABLE,
    ScriptDesign,
    repeat_differences,
    script_measure,
    stack_tolerance,
    subprocess_runner,
    tune_script,
)
from tests.integrations.conftest import SCRIPTS, needs

LOOP = str(SCRIPTS / "train_loop.py")
TRAINER = str(SCRIPTS / "train_trainer.py")
WINDOWS = str(SCRIPTS / "train_windows.py")  # registers the planted levers in its run
# 2 script steps before the levers, 2 parity steps, then 2 pairs of windows of 2 timed steps
# (--steps 4 over 2 rounds), C B B C, 1 untimed step after each switch: 15 steps
SMALL = ["--steps", "4", "--warmup", "1", "--parity-steps", "2", "--resamples", "200",
         "--no-audit", "--budget", "15m"]
SMALL_DESIGN = ScriptDesign(TrialDesign(steps=4, warmup=1, parity_steps=2, resamples=200))
SMALL_OPTIONS = TuneOptions(
    budget_s=900, design=SMALL_DESIGN.trial, rounds=SMALL_DESIGN.rounds, use_audit=False
)
pytestmark = pytest.mark.slow


@pytest.fixture
def planted():
    """The planted levers registered in this process too (the search's side)."""
    spec = importlib.util.spec_from_file_location("planted_levers", SCRIPTS / "planted_levers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    load_all()
    module.register_planted()
    yield
    module.unregister_planted()


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
    assert "one run of the script, 2 window(s) of each side alternating (candidate first); 4 "
    "paired steps" in trial["warnings"][0]
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
    assert ("ended after 3 optimizer step(s); levers tune runs it to its optimizer step 15 each "
            "time") in err
    assert "let the script run at least 15 optimizer steps" in err


@needs("accelerate")
@needs("transformers")
def test_the_trainer_script_goes_through_a_trial(capsys, tmp_path):
    record = tmp_path / "tune.jsonl"
    code = main(["tune", *SMALL, "--rounds", "1", "--lever", "ac-full", "--record", str(record),
                 "--", "python", TRAINER, "--max-steps", "20", "--output-dir",
                 str(tmp_path / "run")])
    out = capsys.readouterr().out
    assert code == 0, out
    events = _events(record)
    _confirmed_where_it_paid(events)
    trial, result = events[0], events[-1]
    assert trial["stack"] == ["ac-full"] and trial["error"] is None
    assert trial["parity"] == "PARITY", trial["parity_note"]
    assert "LlamaForCausalLM" in " ".join(result["notes"])


def test_one_process_per_a_b_parity_against_the_runs_without_levers(planted, tmp_path):
    command = ["python", WINDOWS, "--steps", "40"]
    runner = subprocess_runner(command, SMALL_DESIGN, tmp_path)
    runs = []

    def counted(*args, **kwargs):
        run = runner(*args, **kwargs)
        runs.append(run)
        return run

    result = tune_script(command, replace(SMALL_OPTIONS, only=("test-mark", "test-scale-loss")),
                         run_script=counted)
    trials = result.search.trials
    assert trials, result.outcomes
    # the probe and the repeat check, then one process per A/B
    assert len(runner.launched) == len(runs) == 2 + len(trials)
    assert [w.side for w in runs[2].windows] == ["candidate", "baseline", "baseline", "candidate"]
    by_lever = {trial.stack[-1]: trial for trial in trials}
    # the exact lever that changes nothing keeps the losses; the one that scales them does not
    assert by_lever["test-mark"].parity == PARITY, by_lever["test-mark"].parity_note
    assert by_lever["test-scale-loss"].parity == DAMAGED
    assert "the loss of step 3 of the script differs by" in by_lever["test-scale-loss"].parity_note
    assert "test-scale-loss" not in result.stack


def test_an_unseeded_script_is_not_repeatable(planted, tmp_path):
    command = ["python", WINDOWS, "--steps", "40", "--unseeded"]
    runner = subprocess_runner(command, SMALL_DESIGN, tmp_path)
    result = tune_script(command, replace(SMALL_OPTIONS, only=("test-mark",)), run_script=runner)
    assert result.not_tried.startswith("parity cannot be checked on this script")
    assert len(runner.launched) == 2  # the probe and the repeat check; no A/B
    # and an A/B of it reads "not repeatable", never PARITY
    first, second = runner((), (), 300, rounds=0), runner((), (), 300, rounds=0)
    measure = script_measure(
        runner, SMALL_DESIGN, reference=first.parity_losses,
        repeat=repeat_differences(first.parity_losses, second.parity_losses),
        tolerance_of=lambda stack: stack_tolerance(stack, load_all(), False, None),
    )
    trial = measure((), ("test-mark",), 300)
    assert trial.parity == NOT_MEASURED and trial.parity_note.startswith(NOT_REPEATABLE)
