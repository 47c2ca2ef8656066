"""Exit codes and one-line messages for the ways a workload leaves that are not an Exception,
and input faults that must read as input faults (exit 2), not as levers' own defects (70)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from levers.cli import main

FIXTURES = Path(__file__).parent / "fixtures"
EXITING = FIXTURES / "exiting_factories.py"
MY_WORKLOAD = f"{FIXTURES / 'my_workload.py'}:factory"
QUICK = ["--warmup", "0", "--timed", "1"]


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("factory", ["factory_exits", "step_exits"])
def test_sys_exit_in_the_workload_is_exit_3_with_one_line(capsys, factory):
    code, _, err = run(capsys, "audit", f"{EXITING}:{factory}", *QUICK)
    assert code == 3
    assert err.count("\n") == 1, err
    assert "called sys.exit(0)" in err


def test_sys_exit_in_an_ab_step_is_exit_3(capsys):
    spec = f"{EXITING}:step_exits"
    code, _, err = run(capsys, "ab", spec, "--steps", "2", "--warmup", "0", "--resamples", "100")
    assert code == 3
    assert "called sys.exit(0)" in err


def test_a_base_exception_from_the_step_is_exit_3_with_one_line(capsys):
    code, _, err = run(capsys, "audit", f"{EXITING}:step_raises_base_exception", *QUICK)
    assert code == 3
    assert err.count("\n") == 1, err
    assert "StopTraining: early stop" in err
    assert "Traceback" not in err


def test_a_factory_that_parses_arguments_sees_none_of_levers_own(capsys, monkeypatch):
    spec = f"{EXITING}:parses_arguments"
    monkeypatch.setattr(sys, "argv", ["levers", "audit", spec, *QUICK])
    code, _, err = run(capsys, "audit", spec, *QUICK)
    assert code == 0, err


def test_argparse_failing_in_a_factory_does_not_print_levers_usage(capsys, monkeypatch):
    spec = f"{EXITING}:needs_an_argument"
    monkeypatch.setattr(sys, "argv", ["levers", "audit", spec])
    code, _, err = run(capsys, "audit", spec)
    assert code == 3
    assert "usage: levers" not in err
    assert "usage: exiting_factories.py" in err  # argparse's own line names the user's file
    assert "parses command-line arguments" in err


def test_a_directory_given_as_a_workload_says_it_is_a_directory(capsys, tmp_path):
    code, _, err = run(capsys, "audit", str(tmp_path))
    assert code == 2
    assert "is a directory" in err


def test_audit_of_a_step_whose_loss_is_nan_warns(capsys):
    code, out, err = run(capsys, "audit", f"{EXITING}:nan_loss", *QUICK, "--no-memory-model")
    assert "warning: the step's loss is nan" in err


def _blocked_dir(tmp_path: Path) -> Path:
    # a path under a regular file cannot be created, even by root (permission bits would not do)
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    return blocker / "out"


def test_memory_json_into_an_unwritable_directory_is_exit_2_before_the_prediction(
    capsys, tmp_path, monkeypatch
):
    import levers.memory.predict as predict

    def never(*args, **kwargs):
        raise AssertionError("the prediction ran before the --json path was checked")

    monkeypatch.setattr(predict, "run_prediction", never)
    target = _blocked_dir(tmp_path) / "plan.json"
    code, _, err = run(capsys, "memory", MY_WORKLOAD, "--json", str(target))
    assert code == 2, err
    assert str(target) in err


def test_init_prereg_into_an_unwritable_directory_is_exit_2(capsys, tmp_path):
    target = _blocked_dir(tmp_path) / "ab.toml"
    code, _, err = run(capsys, "ab", "--init-prereg", str(target), "demo")
    assert code == 2, err
    assert str(target) in err
