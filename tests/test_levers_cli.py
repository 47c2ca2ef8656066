"""The levers command line (levers.cli.main): exit codes, messages and the audit summary, on CPU.

Named apart from tests/ab/test_cli.py: pytest imports test files by their base name.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import levers.capture
from levers.cli import main
from levers.capture.json_io import SCHEMA, read_capture, write_capture

FIXTURES = Path(__file__).parent / "fixtures"
MY_WORKLOAD = f"{FIXTURES / 'my_workload.py'}:factory"
BAD = FIXTURES / "bad_factories.py"
QUICK = ["--warmup", "0", "--timed", "1"]


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_audit_fixture_workload_prints_summary(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")  # a long temporary path is not wrapped into the line
    code, out, err = run(capsys, "audit", MY_WORKLOAD, "--set", "hidden=16", "batch_size=8", *QUICK)
    assert code == 0, err
    assert err == ""  # no progress line when stderr is not a terminal
    assert out.splitlines()[0] == "levers audit my_workload (hidden=16, batch_size=8)"
    for section in (
        "figures: measured:",
        "ops ",
        "FLOPs ",
        "bytes moved ",
        "wall time / step ",
        "captured step ",
        "tokens / step ",
        "tokens / s ",
        "peak memory ",
        "By phase",
        "Top modules by FLOPs",
        "Top source lines by FLOPs",
        "Top modules by bytes moved",
        "Top source lines by bytes moved",
        "Calls recorded for diagnosis",
    ):
        assert section in out, section
    # the model's matmuls are attributed to its modules and to the line that calls them
    assert "fc1 " in out and "fc2 " in out
    assert "my_workload_layers.py:13" in out
    assert "return self.fc2(torch.relu(self.fc1(x)))" in out


def test_audit_json_round_trips(capsys, tmp_path):
    path = tmp_path / "step.json"
    code, out, err = run(capsys, "audit", MY_WORKLOAD, *QUICK, "--json", str(path))
    assert code == 0, err
    assert err == f"wrote the capture to {path}\n"
    data = json.loads(path.read_text())
    assert data["schema"] == SCHEMA
    capture = read_capture(path)
    assert capture.workload == "my_workload"
    assert capture.tokens_per_step == 4
    assert f"{len(capture.ops)} aten ops in one step" in out
    # the findings ride along under "audit"
    assert data["audit"]["schema"] == "levers.audit/1"
    assert isinstance(data["audit"]["findings"], list)
    # written again from what was read, the file is byte for byte the same
    again = tmp_path / "again.json"
    write_capture(capture, again, extra={"audit": data["audit"]})
    assert again.read_bytes() == path.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["again.json", "step.json"]


def test_json_into_missing_directory_fails_before_capture(capsys, tmp_path, monkeypatch):
    def no_capture(*args, **kwargs):
        raise AssertionError("the capture must not run")

    monkeypatch.setattr(levers.capture, "capture_step", no_capture)
    code, _, err = run(capsys, "audit", MY_WORKLOAD, "--json", str(tmp_path / "no" / "x.json"))
    assert code == 2
    assert "does not exist; create it first" in err


def test_unknown_workload(capsys):
    code, out, err = run(capsys, "audit", "lama")
    assert code == 2
    assert out == ""
    assert err.startswith("levers: error: unknown workload 'lama'. Did you mean 'llama'?")
    assert "Traceback" not in err


def test_missing_file(capsys):
    code, _, err = run(capsys, "audit", "no/such/file.py:factory")
    assert code == 2
    assert "levers: error: workload file 'no/such/file.py' does not exist" in err


def test_factory_raises_shows_user_traceback(capsys):
    code, _, err = run(capsys, "audit", f"{BAD}:raises")
    assert code == 2
    assert err.startswith("levers: error: the factory for workload")
    assert "raised RuntimeError: vocabulary file vocab.txt is empty" in err
    assert "Traceback (most recent call last" in err
    assert str(BAD) in err
    assert 'raise RuntimeError(f"vocabulary file {path} is empty")' in err
    assert "loader.py" not in err


def test_factory_rejects_parameter(capsys):
    code, _, err = run(capsys, "audit", f"{BAD}:strict", "--set", "width=2", "colour=red")
    assert code == 2
    assert "It accepts: width (required), depth=2" in err


def test_step_raises_exits_3_with_user_traceback(capsys):
    code, out, err = run(capsys, "audit", f"{BAD}:step_raises", *QUICK)
    assert code == 3
    assert out == ""
    assert "levers: error: the step of workload" in err
    assert "FloatingPointError: loss is nan at step 0" in err
    assert "in _check_loss" in err
    assert 'raise FloatingPointError("loss is nan at step 0")' in err


def test_a_step_that_runs_no_op_is_refused_not_audited_to_nothing(capsys):
    """Defect N20 (factory form): an empty step audited to no finding, rc 0."""
    code, out, err = run(capsys, "audit", f"{BAD}:empty_step", "--no-memory-model", *QUICK)
    assert code == 2
    assert "Findings" not in out
    assert "ran no torch op or call, so there is nothing to capture" in err
    assert "make its step() run one whole training step" in err


def test_missing_dependency(capsys):
    code, _, err = run(capsys, "audit", f"{FIXTURES / 'missing_dependency.py'}:factory")
    assert code == 2
    assert "needs the module 'levers_fixture_not_installed'" in err


def test_malformed_set(capsys):
    code, _, err = run(capsys, "audit", MY_WORKLOAD, "--set", "hidden")
    assert code == 2
    assert (
        err
        == "levers: error: --set expects key=value (for example --set batch_size=4), got 'hidden'\n"
    )


@pytest.mark.parametrize("argv", [["audit", "--top", "0"], ["audit", "--warmup", "-1"]])
def test_bad_counts_are_usage_errors(capsys, argv):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert "must be at least" in capsys.readouterr().err


def test_no_verb_prints_help(capsys):
    code, out, _ = run(capsys)
    assert code == 2
    assert "audit" in out


def _crash(*args, **kwargs):
    raise RuntimeError("join failed: kernel without op")


@pytest.mark.parametrize(
    "argv, env, shows_traceback",
    [
        (["audit", MY_WORKLOAD], None, False),
        (["--debug", "audit", MY_WORKLOAD], None, True),
        (["audit", MY_WORKLOAD, "--debug"], None, True),
        (["audit", MY_WORKLOAD], "1", True),
    ],
)
def test_internal_error(capsys, monkeypatch, argv, env, shows_traceback):
    monkeypatch.setattr(levers.capture, "capture_step", _crash)
    if env is None:
        monkeypatch.delenv("LEVERS_DEBUG", raising=False)
    else:
        monkeypatch.setenv("LEVERS_DEBUG", env)
    code, _, err = run(capsys, *argv)
    assert code == 70
    assert "levers: internal error: RuntimeError: join failed: kernel without op" in err
    assert "please report it" in err
    assert ("Traceback (most recent call last)" in err) is shows_traceback
    assert ("in _crash" in err) is shows_traceback


def test_interrupt(capsys, monkeypatch):
    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(levers.capture, "capture_step", interrupt)
    code, _, err = run(capsys, "audit", MY_WORKLOAD)
    assert code == 130
    assert err == "levers: interrupted\n"


def test_progress_reaches_capture(capsys, monkeypatch):
    seen = {}
    real = levers.capture.capture_step

    def spy(workload, **kwargs):
        seen.update(kwargs)
        return real(workload, **kwargs)

    monkeypatch.setattr(levers.capture, "capture_step", spy)
    code, _, _ = run(capsys, "audit", MY_WORKLOAD, "--warmup", "2", "--timed", "1")
    assert code == 0
    assert seen["warmup"] == 2 and seen["timed"] == 1
    assert callable(seen["progress"])


def test_entry_point_in_a_fresh_process(tmp_path):
    """The installed command, as a user runs it: exit codes and no traceback from levers."""
    env = {**os.environ, "COLUMNS": "160"}
    env.pop("LEVERS_DEBUG", None)
    ok = subprocess.run(
        [sys.executable, "-m", "levers.cli", "audit", "fixtures/my_workload.py:factory", *QUICK],
        cwd=FIXTURES.parent,
        capture_output=True,
        check=False,
        text=True,
        env=env,
        timeout=300,
    )
    assert ok.returncode == 0, ok.stderr
    assert "Top source lines by FLOPs" in ok.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "levers.cli", "audit", "nope"],
        capture_output=True,
        check=False,
        text=True,
        env=env,
        timeout=300,
    )
    assert bad.returncode == 2
    assert bad.stderr.startswith("levers: error: unknown workload 'nope'")
    assert "Traceback" not in bad.stderr
