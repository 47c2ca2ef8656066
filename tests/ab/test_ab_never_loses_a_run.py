"""``levers ab`` checks every input before the first step and never throws away a finished run."""

from __future__ import annotations

import json

import pytest
from ab_helpers import SPEC

import levers.ab.runner as runner_mod
from levers.ab.record import read_record
from levers.cli import main

QUICK = ["--steps", "10", "--warmup", "1", "--parity-steps", "2", "--resamples", "200"]


def run(capsys, *argv):
    code = main(["ab", *argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def no_steps(monkeypatch):
    """Fails the test if the comparison starts: the fault must be found before the first step."""

    def never(*args, **kwargs):
        raise AssertionError("run_ab started before the inputs were checked")

    monkeypatch.setattr(runner_mod, "run_ab", never)


def _blocked(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    return blocker / "sub"


@pytest.mark.parametrize("option", ["--json", "--md"])
def test_an_unwritable_output_is_refused_before_the_first_step(capsys, tmp_path, no_steps, option):
    target = _blocked(tmp_path) / "r.out"
    code, _, err = run(capsys, SPEC, *QUICK, option, str(target))
    assert code == 2, err
    assert str(target) in err


def test_too_few_resamples_are_refused_before_the_first_step(capsys, no_steps):
    code, _, err = run(capsys, SPEC, "--steps", "10", "--resamples", "50")
    assert code == 2, err
    assert "at least 100" in err


def _prereg(tmp_path, **design):
    from levers.ab.prereg import template

    path = tmp_path / "ab.toml"
    path.write_text(template({"baseline": SPEC, **design}))
    return path


def test_a_prereg_with_a_bad_design_is_not_frozen(capsys, tmp_path, no_steps):
    path = _prereg(tmp_path, steps=10, resamples=50)
    code, _, err = run(capsys, "--prereg", str(path))
    assert code == 2, err
    assert "at least 100" in err
    assert read_record(f"{path}.record.jsonl") == []  # nothing frozen


def test_a_prereg_whose_record_is_damaged_is_refused_before_the_first_step(
    capsys, tmp_path, no_steps
):
    path = _prereg(tmp_path, steps=10, resamples=200)
    (tmp_path / "ab.toml.record.jsonl").write_text('{"event": "freeze"')  # cut mid-line
    code, _, err = run(capsys, "--prereg", str(path))
    assert code == 2, err
    assert "incomplete" in err


def test_a_record_damaged_during_the_run_still_prints_the_table_and_saves_the_result(
    capsys, tmp_path, monkeypatch
):
    path = _prereg(tmp_path, steps=10, warmup=1, parity_steps=2, resamples=200)
    record = tmp_path / "ab.toml.record.jsonl"
    real = runner_mod.run_ab

    def damaging(*args, **kwargs):
        result = real(*args, **kwargs)
        with open(record, "a") as handle:
            handle.write('{"half a line')  # another process cut the record meanwhile
        return result

    monkeypatch.setattr(runner_mod, "run_ab", damaging)
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, "--prereg", str(path))
    assert code == 2, err
    assert "decision:" in out  # the table was printed
    saved = [p for p in tmp_path.glob("levers-ab-result-*.json")]
    assert len(saved) == 1, list(tmp_path.iterdir())
    assert str(saved[0].name) in err
    doc = json.loads(saved[0].read_text())
    assert doc["event"] == "result" and len(doc["samples"]["baseline"]["dur_ms"]) == 10


@pytest.mark.parametrize("returns", ["tuple", "dict"])
def test_a_nan_loss_inside_a_tuple_or_dict_trips_the_kill_line(capsys, tmp_path, returns):
    # parity steps 1-2 and warm-up step 3 are finite; timed step 2 (step 5 overall) is NaN
    out_json = tmp_path / "r.json"
    code, _, err = run(
        capsys, SPEC, *QUICK, "--set", f"returns={returns}", "nan_at=5", "--json", str(out_json)
    )
    assert code == 4, err
    doc = json.loads(out_json.read_text())
    assert doc["killed"]["kind"] == "nonfinite_loss"


def test_a_step_with_no_readable_loss_says_so_on_screen(capsys):
    code, out, err = run(capsys, SPEC, *QUICK, "--set", "returns=logits_only")
    assert code == 0, err
    assert "no scalar loss" in out + err
    assert "NaN/inf kill line was off" in out + err


def test_ctrl_c_keeps_what_was_measured_as_a_partial_result(capsys, tmp_path):
    out_json = tmp_path / "r.json"
    # steps 1-2 parity, 3 warm-up, then timed steps: interrupted at the 5th timed step
    code, _, err = run(
        capsys, SPEC, *QUICK, "--set-b", "interrupt_at=8", "--json", str(out_json)
    )
    assert code == 130, err
    doc = json.loads(out_json.read_text())
    assert doc["killed"]["kind"] == "interrupted"
    assert doc["partial"] is True
    assert len(doc["samples"]["baseline"]["dur_ms"]) == 5
    assert "partial" in err


def test_a_run_with_too_few_steps_for_its_ci_says_so(capsys):
    code, out, err = run(capsys, SPEC, "--steps", "3", "--warmup", "0", "--resamples", "200")
    assert code == 0, err
    assert "only 3 timed steps per side" in out + err


def test_workloads_in_a_prereg_resolve_against_its_directory(capsys, tmp_path, monkeypatch):
    import shutil

    from ab_helpers import FACTORIES

    from levers.ab.prereg import template

    study = tmp_path / "study"
    study.mkdir()
    shutil.copy(FACTORIES, study / "factories.py")
    path = study / "ab.toml"
    path.write_text(
        template(
            {"baseline": "factories.py:build", "steps": 10, "warmup": 1, "parity_steps": 2,
             "resamples": 200}
        )
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    code, _, err = run(capsys, "--prereg", str(path))
    assert code == 0, err


@pytest.mark.parametrize(
    "line, message",
    [
        (b"\xff\xfe not text\n", "is not UTF-8 text"),
        (b"[1, 2]\n", "is a JSON list, not an event object"),
        (b'{"event": "freeze", "sha256": "00"}\n', "is a freeze event without the frozen text"),
    ],
)
def test_a_damaged_record_line_is_an_input_fault_with_what_to_do(
    capsys, tmp_path, no_steps, line, message
):
    path = _prereg(tmp_path, steps=10, resamples=200)
    (tmp_path / "ab.toml.record.jsonl").write_bytes(line)
    code, _, err = run(capsys, "--prereg", str(path))
    assert code == 2, err
    assert f"ab.toml.record.jsonl:1 {message}" in err
    assert "Move the damaged line out of the record" in err
