"""The shared options of cli/options.py: each declared there once, one spelling and one meaning
in every verb, the older spellings still read."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

import levers.cli
from levers.cli import build_parser, main
from levers.cli.options import WORKLOAD_FORMS

CLI_DIR = Path(levers.cli.__file__).parent
SHARED = {"--gpu", "--target", "--json", "--md", "--html", "--steps", "--timed", "--warmup"}


def _flags_declared(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
            found |= {a.value for a in node.args if isinstance(a, ast.Constant)}
    return found


def test_the_shared_options_are_declared_in_options_py_alone():
    offenders = {
        p.name: sorted(_flags_declared(p) & SHARED)
        for p in CLI_DIR.glob("*.py")
        if p.name != "options.py" and _flags_declared(p) & SHARED
    }
    assert offenders == {}


def _subparsers():
    parser = build_parser()
    (action,) = [a for a in parser._actions if a.dest == "verb"]
    return action.choices


def test_every_output_option_is_read_into_one_destination():
    for verb, sub in _subparsers().items():
        for action in sub._actions:
            for flag in set(action.option_strings) & {"--json", "--md", "--html"}:
                assert action.dest == f"{flag[2:]}_path", (verb, flag)
                assert action.metavar == "FILE", (verb, flag)


def test_the_workload_positional_reads_alike_in_every_verb():
    for verb in ("audit", "memory", "tune"):
        (positional,) = [
            a for a in _subparsers()[verb]._actions if not a.option_strings and a.dest == "workload"
        ]
        assert positional.metavar == "WORKLOAD" and WORKLOAD_FORMS in positional.help


def test_audit_and_memory_default_to_one_gpu():
    from levers.audit.config import DEFAULT_TARGET
    from levers.hardware import DEFAULT_GPU, resolve_gpu

    assert resolve_gpu(DEFAULT_TARGET) is resolve_gpu(DEFAULT_GPU)
    for verb in ("audit", "memory"):
        (gpu,) = [a for a in _subparsers()[verb]._actions if "--gpu" in a.option_strings]
        assert gpu.default is None and f"default: {DEFAULT_GPU}" in gpu.help


@pytest.mark.parametrize(
    ("argv", "dest", "value"),
    [
        (["audit", "--target", "h200"], "target", "h200"),
        (["audit", "--gpu", "h200"], "target", "h200"),
        (["audit", "--timed", "2"], "steps", 2),
        (["audit", "--steps", "2"], "steps", 2),
        (["memory", "demo", "--steps", "2"], "predict_steps", 2),
        (["memory", "demo", "--predict-steps", "2"], "predict_steps", 2),
        (["ab", "demo", "--steps", "7", "--warmup", "2"], "steps", 7),
        (["tune", "demo", "--warmup", "2"], "warmup", 2),
    ],
)
def test_the_older_spellings_are_still_read(argv, dest, value):
    assert getattr(build_parser().parse_args(argv), dest) == value


def test_the_help_names_each_older_spelling():
    help_of = {v: s.format_help() for v, s in _subparsers().items()}
    assert "--target is its older spelling" in " ".join(help_of["audit"].split())
    assert "--timed is its older spelling" in " ".join(help_of["audit"].split())
    assert "--steps is its older spelling" in " ".join(help_of["memory"].split())


@pytest.mark.parametrize("verb", [["audit"], ["memory", "demo"], ["ab", "demo"], ["tune", "demo"]])
def test_a_negative_warmup_is_a_usage_error_in_every_verb(verb, capsys):
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args([*verb, "--warmup", "-1"])
    assert info.value.code == 2
    assert "must be at least 0" in capsys.readouterr().err


def test_list_writes_its_json_to_a_file_or_prints_it(tmp_path, capsys):
    assert main(["list", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    target = tmp_path / "out" / "levers.json"
    assert main(["list", "--json", str(target)]) == 0
    assert json.loads(target.read_text()) == printed
