"""``levers tune`` on the command line: exit codes, the printed answer, the record."""

from __future__ import annotations

import json
from pathlib import Path

from levers.cli import main

FIXTURE = str(Path(__file__).parents[1] / "fixtures" / "my_workload.py") + ":factory"


def test_a_bad_budget_exits_2_with_what_reads(capsys):
    assert main(["tune", "demo", "--budget", "soon"]) == 2
    assert "write the budget as 10m" in capsys.readouterr().err


def test_an_unknown_lever_exits_2(capsys, tmp_path):
    assert main(["tune", "demo", "--lever", "nope", "--record", str(tmp_path / "r")]) == 2
    assert "unknown lever 'nope'" in capsys.readouterr().err


def test_the_script_form_says_what_it_cannot_do_and_what_to_do_instead(capsys, tmp_path):
    script = tmp_path / "train.py"
    script.write_text("raise SystemExit('must not run')\n")
    assert main(["tune", "--", "python", str(script)]) == 2
    err = capsys.readouterr().err
    assert "cannot tune a script after -- yet" in err
    assert "levers tune path/to/train.py:factory" in err


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
