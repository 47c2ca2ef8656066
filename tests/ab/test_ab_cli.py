"""``levers ab`` end to end on CPU with the tiny factory file."""

from __future__ import annotations

import json

import pytest
from ab_helpers import SPEC

from levers.ab.record import read_record
from levers.cli import main

QUICK = ["--steps", "4", "--warmup", "1", "--parity-steps", "2", "--resamples", "200"]


def run(capsys, *argv):
    code = main(["ab", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_over_a_writes_json_and_markdown(capsys, tmp_path):
    code, out, err = run(
        capsys, SPEC, *QUICK, "--json", str(tmp_path / "r.json"), "--md", str(tmp_path / "r.md")
    )
    assert code == 0, err
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["event"] == "result"
    assert doc["killed"] is None
    assert doc["config"]["num_steps"] == 4 and doc["config"]["num_resamples"] == 200
    assert len(doc["samples"]["baseline"]["dur_ms"]) == 4
    assert len(doc["samples"]["candidate"]["dur_ms"]) == 4
    reads = {r["name"]: r for r in doc["reads"]}
    assert reads["parity"]["verdict"] == "PARITY"
    assert reads["step_time"]["ci"]["num_resamples"] == 200
    assert doc["environment"]["torch"]
    md = (tmp_path / "r.md").read_text()
    assert md.startswith("### levers ab: **")
    assert "| step time |" in md and "| parity |" in md
    assert "decision:" in out and "step time" in out


def test_a_wrong_fix_is_reported_damaged(capsys, tmp_path):
    code, out, err = run(
        capsys, SPEC, *QUICK, "--set-b", "fixed=no_residual", "--json", str(tmp_path / "r.json")
    )
    assert code == 0, err
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["decision"] == "DAMAGED"
    assert doc["candidate"]["params"]["fixed"] == "no_residual"
    assert doc["baseline"]["params"]["fixed"] == "none"
    assert doc["parity"]["passed"] is False
    assert "decision: DAMAGED" in out


def test_init_prereg_writes_a_template_once(capsys, tmp_path):
    path = tmp_path / "ab.toml"
    code, out, _ = run(
        capsys, "--init-prereg", str(path), SPEC, "--set-b", "fixed=rewrite", "--steps", "4"
    )
    assert code == 0
    text = path.read_text()
    assert f'baseline = "{SPEC}"' in text
    assert 'params_b = { fixed = "rewrite" }' in text
    assert "steps = 4 " in text
    assert f"levers ab --prereg {path}" in out
    code, _, err = run(capsys, "--init-prereg", str(path), SPEC)
    assert code == 2
    assert "already exists" in err
    assert path.read_text() == text


def _prereg(capsys, tmp_path, *extra):
    path = tmp_path / "ab.toml"
    assert run(capsys, "--init-prereg", str(path), SPEC, *QUICK, *extra)[0] == 0
    return path


def test_runs_against_a_prereg_append_to_its_record(capsys, tmp_path):
    path = _prereg(capsys, tmp_path, "--set-b", "fixed=rewrite")
    record = tmp_path / "ab.toml.record.jsonl"
    code, out, err = run(capsys, "--prereg", str(path))
    assert code == 0, err
    first = record.read_bytes()
    events = read_record(record)
    assert [e["event"] for e in events] == ["freeze", "result"]
    result = events[1]
    assert result["prereg"]["sha256"] == events[0]["sha256"]
    assert result["prereg"]["freeze_status"] == "new"
    assert result["candidate"]["params"]["fixed"] == "rewrite"
    assert [(e["id"], e["met"]) for e in result["expectations"]][0] == (1, True)  # parity
    assert len(result["samples"]["baseline"]["dur_ms"]) == 4
    assert "pre-registered expectations" in out
    code, _, err = run(capsys, "--prereg", str(path))
    assert code == 0, err
    data = record.read_bytes()
    assert data.startswith(first)
    events = read_record(record)
    assert [e["event"] for e in events] == ["freeze", "result", "result"]
    assert events[2]["prereg"]["freeze_status"] == "unchanged"


def test_an_edited_prereg_is_refused_and_an_amendment_accepted(capsys, tmp_path):
    path = _prereg(capsys, tmp_path)
    record = tmp_path / "ab.toml.record.jsonl"
    assert run(capsys, "--prereg", str(path))[0] == 0
    frozen = path.read_text()
    before = record.read_bytes()
    path.write_text(frozen.replace("size = 0.02", "size = 0.5"))
    code, _, err = run(capsys, "--prereg", str(path))
    assert code == 2
    assert "edited after it was frozen" in err
    assert record.read_bytes() == before
    path.write_text(
        frozen + '\n[[amendments]]\ntext = "two more timed steps"\ndesign = { steps = 6 }\n'
    )
    code, _, err = run(capsys, "--prereg", str(path))
    assert code == 0, err
    events = read_record(record)
    assert record.read_bytes().startswith(before)
    assert [e["event"] for e in events] == ["freeze", "result", "freeze", "result"]
    assert events[3]["prereg"]["num_amendments"] == 1
    assert len(events[3]["samples"]["candidate"]["dur_ms"]) == 6


def test_options_that_contradict_the_prereg_are_refused_before_freezing(capsys, tmp_path):
    path = _prereg(capsys, tmp_path)
    code, _, err = run(capsys, "--prereg", str(path), "--steps", "9", "--set-b", "fixed=rewrite")
    assert code == 2
    assert "--steps 9 (registered: 4)" in err
    assert "--set-b {'fixed': 'rewrite'} (registered: {})" in err
    assert not (tmp_path / "ab.toml.record.jsonl").exists()
    # repeating a registered value is fine
    assert run(capsys, "--prereg", str(path), "--steps", "4")[0] == 0


def test_an_unknown_lever_names_the_available_ones(capsys):
    code, _, err = run(capsys, SPEC, "--lever", "fused-rmsnorm", *QUICK)
    assert code == 2
    assert "unknown lever(s) fused-rmsnorm" in err
    assert "rms-norm-fused" in err and "ac-full" in err and "levers list" in err


def test_a_lever_that_does_not_apply_to_the_candidate_says_why(capsys):
    code, _, err = run(capsys, SPEC, "--lever", "liger-kernels", *QUICK)
    assert code == 2
    assert "lever liger-kernels does not apply" in err


def test_levers_apply_to_the_candidate_and_set_the_exactness(capsys, tmp_path):
    out_json = tmp_path / "r.json"
    code, _, err = run(
        capsys, "demo", "--lever", "inplace-scatter,windowed-peak-metric", *QUICK,
        "--json", str(out_json),
    )
    assert code == 0, err
    doc = json.loads(out_json.read_text())
    assert doc["config"]["exactness"] == "exact"
    assert {r["name"]: r["verdict"] for r in doc["reads"]}["parity"] == "PARITY"


def test_a_nan_loss_exits_4_and_still_writes_the_measurements(capsys, tmp_path):
    out_json = tmp_path / "r.json"
    code, out, _ = run(capsys, SPEC, *QUICK, "--set-b", "nan_at=5", "--json", str(out_json))
    assert code == 4
    doc = json.loads(out_json.read_text())
    assert doc["killed"]["kind"] == "nonfinite_loss"
    assert (doc["killed"]["phase"], doc["killed"]["step"]) == ("timed", 2)
    assert len(doc["samples"]["candidate"]["dur_ms"]) == 2
    assert "KILLED (nonfinite_loss)" in out


def test_a_step_that_raises_exits_3_with_the_users_traceback(capsys, tmp_path):
    out_json = tmp_path / "r.json"
    code, _, err = run(capsys, SPEC, *QUICK, "--set-b", "raise_at=2", "--json", str(out_json))
    assert code == 3
    assert "candidate parity step 2 raised RuntimeError: boom" in err
    assert "ab_factories.py" in err
    assert json.loads(out_json.read_text())["killed"]["kind"] == "step_error"


@pytest.mark.parametrize(
    "argv, message",
    [
        ([], "name the BASELINE workload"),
        (["--prereg", "missing.toml"], "no pre-registration at missing.toml"),
        ([SPEC, "--set-b", "fixed=bogus"], "fixed must be one of"),
    ],
)
def test_usage_errors(capsys, argv, message):
    code, _, err = run(capsys, *argv)
    assert code == 2
    assert message in err
