"""One pre-registration format: ``levers ab --prereg`` and ``levers compare --prereg`` read the
same file, and the files each wrote before the two were one are still read (fixtures in
tests/fixtures/prereg/)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from ab_helpers import SPEC

from levers.ab.prereg import PreregError, parse_prereg, parse_preregistration
from levers.ab.record import read_record, record_path_for
from levers.cli import main
from levers.runs.prereg import parse_run_prereg

FIXTURES = Path(__file__).parents[1] / "fixtures" / "prereg"


def _text(name: str) -> str:
    return (FIXTURES / name).read_text().replace("@SPEC@", SPEC)


def _cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_an_ab_file_from_before_the_one_format_is_still_read_by_levers_ab():
    prereg = parse_prereg(_text("ab_before_one_format.toml"))
    assert prereg.design["baseline"] == SPEC and prereg.design["steps"] == 4
    assert prereg.reads == ("step_time", "tokens_per_s", "peak_allocated", "parity")
    assert [(e.id, e.read) for e in prereg.expectations] == [
        (1, "parity"), (2, "step_time"), (3, "peak_allocated")
    ]


def test_a_run_file_from_before_the_one_format_is_still_read_by_the_run_tools():
    prereg = parse_run_prereg(_text("run_before_one_format.toml"))
    assert prereg.gates["banner"] == {"datasets": 880, "frames": 100}
    assert prereg.read(1).metric == "eval_loss" and prereg.read(1).baseline == "parent.npz"
    assert prereg.design["seed"] == 1  # a run's design is free-form
    assert [e.id for e in prereg.expectations] == [1, 2]


def test_one_file_gives_the_ab_its_design_and_the_run_its_reads():
    text = _text("one_format.toml")
    whole = parse_preregistration(text)
    assert whole.step_reads == ("parity", "step_time")
    assert [r.name for r in whole.quality_reads] == ["primary"]
    ab = parse_prereg(text)
    assert ab.design["params_b"] == {"fixed": "rewrite"} and ab.reads == ("parity", "step_time")
    assert ab.kill == {"nonfinite_loss": True, "time_budget_s": 600, "mem_gate_gib": 71.0}
    assert [e.id for e in ab.expectations] == [1]  # expectation 2 is checked by hand
    run = parse_run_prereg(text)
    assert run.read(1).metric == "eval_loss" and run.gates["banner"] == {"datasets": 880}
    assert run.kill["metrics"] == [{"name": "eval_loss", "bar": 10.0}]


def test_a_run_file_without_a_baseline_is_refused_by_levers_ab():
    with pytest.raises(PreregError, match="design.baseline must name the baseline workload"):
        parse_prereg(_text("run_before_one_format.toml"))


def test_a_step_read_table_holds_a_name_only():
    text = _text("one_format.toml").replace('[[reads]]\nname = "parity"', '[[reads]]\nname = "parity"\nbetter = "lower"')
    with pytest.raises(PreregError, match="reads must be a list drawn from"):
        parse_preregistration(text)


def test_levers_ab_and_levers_compare_run_from_the_same_file(capsys, tmp_path):
    path = tmp_path / "change.toml"
    path.write_text(_text("one_format.toml"))
    code, out, err = _cli(capsys, "ab", "--prereg", str(path), "--json", str(tmp_path / "r.json"))
    assert code == 0, err
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["candidate"]["params"]["fixed"] == "rewrite"
    assert [o["id"] for o in doc["expectations"]] == [1]
    ids = np.arange(8)
    np.savez(tmp_path / "parent.npz", id=ids, eval_loss=np.full(8, 2.0))
    np.savez(tmp_path / "this.npz", id=ids, eval_loss=np.full(8, 2.0))
    code, out, err = _cli(capsys, "compare", "--prereg", str(path), "--read", "1")
    assert code == 0, err
    assert "PARITY" in out
    events = [e["event"] for e in read_record(record_path_for(path))]
    assert events[0] == "freeze" and "result" in events and events.count("freeze") == 1
