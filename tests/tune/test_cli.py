"""``levers tune`` on the command line: exit codes, the printed answer, the record."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from levers.cli import main

FIXTURE = str(Path(__file__).parents[1] / "fixtures" / "my_workload.py") + ":factory"


def test_a_bad_budget_exits_2_with_what_reads(capsys):
    assert main(["tune", "demo", "--budget", "soon"]) == 2
    assert "write the budget as 10m" in capsys.readouterr().err


def test_an_unknown_lever_exits_2(capsys, tmp_path):
    assert main(["tune", "demo", "--lever", "nope", "--record", str(tmp_path / "r")]) == 2
    assert "unknown lever 'nope'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["demo", "--"], "got both a workload (demo) and a script"),
        (["--set", "batch_size=8", "--"], "--set sets a factory's parameters"),
        (["--rounds", "0", "--"], "--rounds must be at least 1"),
        (["--budget", "soon", "--"], "write the budget as 10m"),
        (["--json", "{tmp}/train.py/x.json", "--"], "cannot write"),
        (["--record", "{tmp}", "--"], "record"),
    ],
)
def test_the_script_form_refuses_bad_input_before_the_script_runs(capsys, tmp_path, argv, says):
    script = tmp_path / "train.py"
    script.write_text("raise SystemExit('must not run')\n")
    argv = [arg.replace("{tmp}", str(tmp_path)) for arg in argv]
    assert main(["tune", *argv, "python", str(script)]) == 2
    err = capsys.readouterr().err
    assert says in err and "must not run" not in err


def test_the_script_form_needs_a_script_that_exists(capsys):
    assert main(["tune", "--"]) == 2
    assert "nothing after --" in capsys.readouterr().err
    assert main(["tune", "--", "python", "no_such_train.py"]) == 2
    assert "no such script: no_such_train.py" in capsys.readouterr().err


def test_rounds_are_for_a_script(capsys):
    assert main(["tune", "demo", "--rounds", "2"]) == 2
    assert "--rounds is for a script after --" in capsys.readouterr().err


def test_a_run_prints_every_lever_s_fate_and_appends_the_record(capsys, tmp_path):
    record = tmp_path / "tune.record.jsonl"
    out_json = tmp_path / "tune.json"
    code = main([
        "tune", FIXTURE, "--lever", "windowed-peak-metric,compile-blocks",
        "--steps", "4", "--warmup", "1", "--parity-steps", "2", "--resamples", "200",
        "--no-audit", "--record", str(record), "--json", str(out_json),
    ])
    assert code == 0
    out = capsys.readouterr().out
    assert "levers considered:" in out
    assert "compile-blocks: its speed-up exists only on a GPU" in out
    assert "windowed-peak-metric:" in out
    events = [json.loads(line) for line in record.read_text().splitlines()]
    assert events[-1]["event"] == "tune-result"
    assert json.loads(out_json.read_text())["workload"] == FIXTURE
