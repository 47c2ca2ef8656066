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
    # a metric lever is no speed candidate: no A/B ran, and that is not "nothing pays"
    assert "windowed-peak-metric: it changes nothing the step computes" in out
    assert "nothing tried: no lever can be tried on this step" in out
    assert "nothing pays here" not in out
    events = [json.loads(line) for line in record.read_text().splitlines()]
    assert [e["event"] for e in events] == ["tune-result"]
    assert events[-1]["nothing_tried"].startswith("no lever can be tried")
    assert json.loads(out_json.read_text())["workload"] == FIXTURE


def _stalled_tune(tmp_path: Path, argv: list[str], marker: Path) -> tuple[int, str, str]:
    """Run ``levers tune *argv`` in a process of its own, send it Ctrl-C once ``marker`` exists
    (the workload or script writes it inside a timed step and stalls there), and return its
    exit code and output."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import levers

    env = dict(os.environ)
    src = str(Path(levers.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    # Ctrl-C as a terminal delivers it: a suite started in the background (`cmd &` in a shell
    # without job control) ignores SIGINT, and a child inherits that, so Python would install no
    # KeyboardInterrupt handler in it and the signal would be lost
    proc = subprocess.Popen(
        [sys.executable, "-m", "levers.cli", "tune", *argv], cwd=tmp_path, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 600  # a generous bound on a loaded host, not a timing
        while not marker.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                out, err = proc.communicate()
                pytest.fail(f"the run ended (or stalled elsewhere) before the marker:\n{out}\n"
                            f"{err}")
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, out, err


def test_ctrl_c_during_the_timed_steps_ends_the_search_with_exit_130_and_the_record(tmp_path):
    marker, record, out_json = tmp_path / "stalled", tmp_path / "r.jsonl", tmp_path / "t.json"
    stalling = str(Path(__file__).parents[1] / "fixtures" / "stalling_workload.py") + ":factory"
    code, out, err = _stalled_tune(tmp_path, [
        stalling, "--set", f"marker={marker}", "--lever", "inplace-scatter,loss-valid-rows",
        "--steps", "4", "--warmup", "1", "--parity-steps", "1", "--resamples", "200",
        "--no-audit", "--record", str(record), "--json", str(out_json),
    ], marker)
    assert code == 130, out + err
    events = [json.loads(line) for line in record.read_text().splitlines()]
    assert [e["event"] for e in events] == ["tune-trial", "tune-result"]
    trial, result = events
    # the Ctrl-C landed in the first timed step of the first A/B, and nothing ran after it
    assert trial["killed_kind"] == "interrupted" and trial["stack"] == ["inplace-scatter"]
    assert trial["killed"] == "interrupted (Ctrl-C) during baseline timed step 1"
    assert result["interrupted"] is True and result["stack"] == []
    assert json.loads(out_json.read_text())["interrupted"] is True
    assert "INTERRUPTED (Ctrl-C)" in out
    assert "dropped loss-valid-rows: not tried: the search was interrupted (Ctrl-C)" in out
    assert "nothing pays here" not in out
    assert "levers: interrupted: the A/Bs run so far and the result are kept in" in err


@pytest.mark.slow
def test_ctrl_c_during_a_run_of_a_script_ends_the_search_and_kills_the_run(tmp_path):
    import os

    marker, record, runs = tmp_path / "stalled", tmp_path / "r.jsonl", tmp_path / "runs"
    script = Path(__file__).parents[1] / "fixtures" / "scripts" / "stalling_loop.py"
    # runs 1 and 2 are the probe and the repeat check; run 3 is the first A/B's first side,
    # stalled in its step 3: the first timed step (2 before the levers, --warmup 1)
    code, out, err = _stalled_tune(tmp_path, [
        "--lever", "ac-full", "--steps", "4", "--warmup", "1", "--parity-steps", "1",
        "--resamples", "200", "--no-audit", "--record", str(record), "--",
        "python", str(script), "--runs", str(runs), "--marker", str(marker),
    ], marker)
    assert code == 130, out + err
    events = [json.loads(line) for line in record.read_text().splitlines()]
    assert [e["event"] for e in events] == ["tune-trial", "tune-result"]
    assert events[0]["killed_kind"] == "interrupted" and events[0]["stack"] == ["ac-full"]
    assert events[1]["interrupted"] is True and events[1]["stack"] == []
    assert "INTERRUPTED (Ctrl-C)" in out
    # the stalled run was killed (and reaped) before levers exited
    with pytest.raises(ProcessLookupError):
        os.kill(int(marker.read_text()), 0)
