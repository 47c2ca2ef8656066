"""Small input-handling flaws (defect N21): each input says what is wrong with it, and nothing
given is silently dropped or read as something else."""

from __future__ import annotations

import errno
import os
import warnings
from pathlib import Path

import pytest
import torch
from rich.console import Console

import levers
from levers.cli import main
from levers.errors import LeversError
from levers.integrations.script import _script_environment, parse_command
from levers.levers.lever import LeverNotFound
from levers.memory.plan import FitPoint, FitResult
from levers.memory.render import _fit
from levers.output.atomic import unwritable

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
WORKLOAD = FIXTURES / "my_workload.py"
LOOP = FIXTURES / "scripts" / "train_loop.py"


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# --- workload specs ----------------------------------------------------------------------------


def test_a_spec_with_nothing_before_its_colon_asks_for_a_file_or_module(capsys):
    code, _, err = run(capsys, "audit", ":factory", "--no-memory-model")
    assert code == 2
    assert "names no file or module before the colon" in err
    assert "path/to/file.py:factory or package.module:factory" in err
    assert "is a directory" not in err


def test_a_spec_with_nothing_after_its_colon_asks_for_a_function(capsys):
    code, _, err = run(capsys, "audit", f"{WORKLOAD}:", "--no-memory-model")
    assert code == 2
    assert "names no function after the colon" in err
    assert "(functions defined there: factory)" in err
    assert "unknown workload" not in err


# --- --set -------------------------------------------------------------------------------------


def test_a_set_key_given_twice_with_two_values_is_warned_about(capsys):
    from levers.cli import build_parser

    args = build_parser().parse_args(["audit", "demo", "--set", "hidden=8", "hidden=32"])
    assert args.set_items == ["hidden=8", "hidden=32"]  # the last one is used, as before
    err = capsys.readouterr().err
    assert "--set hidden is given twice (hidden=8, then hidden=32); the last one is used" in err
    build_parser().parse_args(["audit", "demo", "--set", "hidden=8", "--set", "hidden=8"])
    assert "given twice" not in capsys.readouterr().err  # the same value twice is no slip


def test_a_set_item_without_a_value_is_refused(capsys):
    code, out, err = run(capsys, "audit", f"{WORKLOAD}:factory", "--set", "hidden=")
    assert code == 2 and out == ""
    assert "--set hidden= gives no value; write hidden=VALUE" in err


# --- options that do nothing where they are given ------------------------------------------------


@pytest.mark.parametrize("option", [["--keep-running"], ["--tokens-per-step", "64"]])
def test_the_script_options_are_refused_with_a_workload(option, capsys):
    code, out, err = run(capsys, "audit", f"{WORKLOAD}:factory", *option)
    assert code == 2 and out == ""
    assert f"{option[0]} is for a script after --" in err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["audit", "--tokens-per-step", "0", "--", "python", "x.py"], "must be at least 1, got 0"),
        (["audit", "demo", "--dist-timeout", "-1"], "must be a positive number of seconds"),
        (["ab", "demo", "--lever", "compile-blocks", "--dist-timeout", "0"],
         "must be a positive number of seconds"),
    ],
)
def test_values_that_cannot_work_are_usage_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_an_empty_lever_option_is_not_every_lever(capsys):
    code, out, err = run(capsys, "tune", "demo", "--lever", "")
    assert code == 2 and out == ""
    assert "--lever '' names no lever" in err


# --- levers compare's files --------------------------------------------------------------------


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_a_named_pipe_is_said_to_be_one(tmp_path, capsys):
    baseline = tmp_path / "b.csv"
    baseline.write_text("id,loss\n1,2.0\n2,1.5\n")
    fifo = tmp_path / "fifo.csv"
    os.mkfifo(fifo)
    code, _, err = run(capsys, "compare", str(baseline), str(fifo), "--metric", "loss")
    assert code == 2
    assert "is a named pipe (FIFO), not a file" in err
    assert "no metric file" not in err


def test_an_existing_directory_that_takes_no_file_is_not_said_to_be_missing(tmp_path):
    # what /proc/x.json gives: the directory exists, and creating a file in it says ENOENT
    target = tmp_path / "x.json"
    message = str(unwritable(target, FileNotFoundError(errno.ENOENT, "No such file or directory")))
    assert "create the directory" not in message
    assert f"the directory {str(tmp_path)!r} exists but takes no new files" in message
    missing = tmp_path / "missing" / "x.json"
    message = str(unwritable(missing, FileNotFoundError(errno.ENOENT, "No such file or directory")))
    assert f"create the directory {str(missing.parent)!r} first" in message


# --- the Python API ----------------------------------------------------------------------------


def test_step_ab_of_an_unknown_name_speaks_of_levers():
    with pytest.raises(LeverNotFound) as info:
        levers.Step("demo").ab("compile-block")
    message = str(info.value)
    assert "names no lever (did you mean the lever compile-blocks?) and no workload" in message
    assert "unknown workload" not in message


def test_levers_apply_of_an_unknown_lever_is_a_levers_error():
    with pytest.raises(LeversError) as info:
        levers.apply(torch.nn.Linear(2, 2), "bogus")
    assert isinstance(info.value, ValueError)  # as it was: a refusal of the lever's input
    assert "unknown lever(s) bogus" in str(info.value)


def test_step_tune_without_a_budget_takes_the_default(monkeypatch):
    import levers.tune.run as run_mod

    seen = {}
    monkeypatch.setattr(run_mod, "tune_step",
                        lambda step, options, **kw: seen.update(budget_s=options.budget_s))
    levers.Step("demo").tune(budget=None, measure=lambda *a, **k: None)
    assert seen["budget_s"] == 600.0


# --- python options before the script ----------------------------------------------------------


def test_python_w_and_o_are_taken():
    command = parse_command(["python", "-W", "ignore", "-O", "-Werror::DeprecationWarning",
                             str(LOOP), "--steps", "3"])
    assert command.warning_options == ("ignore", "error::DeprecationWarning")
    assert command.display == (
        f"python -W ignore -O -W error::DeprecationWarning {LOOP} --steps 3"
    )
    assert len(command.notes) == 1 and "python -O cannot apply" in command.notes[0]
    before = list(warnings.filters)
    with _script_environment(command):
        assert warnings.filters[0][:3] == ("error", None, DeprecationWarning)
        assert warnings.filters[1][0] == "ignore"
    assert warnings.filters == before


def test_a_w_option_python_would_refuse_is_refused_first():
    with pytest.raises(LeversError, match="python -W bogus: invalid action: 'bogus'"):
        parse_command(["python", "-W", "bogus", str(LOOP)])


# --- levers memory --fit -----------------------------------------------------------------------


def test_the_fit_answer_is_a_line_not_a_wrapped_table_title():
    fit = FitResult(
        "batch_size", 209576, 75 * 2**30, 0.05,
        (FitPoint(2, 1, 2, True), FitPoint(209742, 3, 4, False)), not_fitting=209742,
    )
    console = Console(width=200, color_system=None, record=True, file=open(os.devnull, "w"))
    console.print(_fit(fit))
    lines = console.export_text().splitlines()
    assert lines[0] == (
        "--fit batch_size: largest that fits = 209576 (209742 does not fit; the search closes "
        "within 0.1%) (reserved ≤ 75.0 GiB, margin 5%)"
    )
    assert lines[1].split() == ["batch_size", "allocated", "reserved", "fits"]
