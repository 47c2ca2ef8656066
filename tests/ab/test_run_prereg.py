"""Run pre-registrations: template, freezing, refusal of edits, guards and reads from the file."""

from __future__ import annotations

import json

import numpy as np
import pytest

from levers.runs.guards import MetricBar, RunGuard, RunKilled
from levers.ab.prereg import PreregError
from levers.ab.record import read_record, record_path_for
from levers.runs.prereg import parse_run_prereg, template
from levers.cli import main

FILLED = (
    template()
    .replace(
        "banner = { datasets = 0, episodes = 0, frames = 0 }",
        "banner = { datasets = 880, frames = 100 }",
    )
    .replace('baseline = "evals/parent.npz"', 'baseline = "parent.npz"')
    .replace('candidate = "evals/this_run.npz"', 'candidate = "this.npz"')
)
AMENDMENT = '\n[[amendments]]\ndate = "2026-08-08"\ntext = "load transient: gate 71 -> 78"\nkill = { mem_gate_gib = 78.0 }\n'


def cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def prereg(tmp_path, capsys):
    path = tmp_path / "run.toml"
    code, out, _ = cli(capsys, "prereg", "init", str(path))
    assert code == 0 and "levers prereg freeze" in out
    assert path.read_text() == template()
    path.write_text(FILLED)
    return path


def freeze(capsys, path):
    code, out, err = cli(capsys, "prereg", "freeze", str(path))
    assert code == 0, err
    return out


def test_init_refuses_to_overwrite(prereg, capsys):
    code, _, err = cli(capsys, "prereg", "init", str(prereg))
    assert code == 2 and "already exists" in err


def test_the_template_parses_into_guard_settings():
    p = parse_run_prereg(FILLED)
    assert p.gates["banner"] == {"datasets": 880, "frames": 100}
    assert p.kill["mem_gate_gib"] == 71.0
    assert p.read(1).metric == "eval_loss" and p.read(1).better == "lower"
    assert [e.id for e in p.expectations] == [1, 2]


def test_an_unfrozen_file_is_refused_by_the_guard(prereg):
    with pytest.raises(PreregError, match="is not frozen: freeze it"):
        RunGuard.from_prereg(prereg)


def test_the_guard_takes_its_kill_lines_and_gates_from_the_frozen_file(prereg, capsys):
    assert "frozen" in freeze(capsys, prereg)
    with pytest.warns(UserWarning, match="memory gate is not enforced"):
        guard = RunGuard.from_prereg(prereg)  # on a CPU with no memory_reader
    assert guard.metric_bars == (MetricBar("eval_loss", 10.0, "lower", 3, 1000),)
    assert guard.mem_gate_bytes == 71 * 1024**3 and guard.window_steps == 100
    assert guard.banner == {"datasets": 880, "frames": 100}
    with pytest.raises(RunKilled):
        guard.check_banner({"datasets": 878, "frames": 100})
    events = read_record(record_path_for(prereg))
    assert [e["event"] for e in events] == ["freeze", "banner", "kill"]


def test_kill_lines_cannot_be_passed_beside_the_file(prereg, capsys):
    freeze(capsys, prereg)
    with pytest.raises(Exception, match="mem_gate_gib come"):
        RunGuard.from_prereg(prereg, mem_gate_gib=200.0)


def test_a_frozen_run_prereg_refuses_an_edit(prereg, capsys):
    freeze(capsys, prereg)
    prereg.write_text(prereg.read_text().replace("mem_gate_gib = 71.0", "mem_gate_gib = 90.0"))
    with pytest.raises(PreregError, match="edited after it was frozen"):
        RunGuard.from_prereg(prereg)
    code, _, err = cli(capsys, "prereg", "freeze", str(prereg))
    assert code == 2 and "edited after it was frozen" in err
    code, _, err = cli(capsys, "prereg", "check", str(prereg))
    assert code == 2


def test_an_amendment_applies_once_frozen(prereg, capsys):
    freeze(capsys, prereg)
    prereg.write_text(prereg.read_text() + AMENDMENT)
    with pytest.raises(PreregError, match="amendment that is not frozen yet"):
        RunGuard.from_prereg(prereg)
    assert "amendment frozen" in freeze(capsys, prereg)
    with pytest.warns(UserWarning, match="memory gate is not enforced"):
        assert RunGuard.from_prereg(prereg).mem_gate_bytes == 78 * 1024**3
    code, out, _ = cli(capsys, "prereg", "check", str(prereg))
    assert code == 0 and "1 amendment(s)" in out and "78.0 GiB" in out


def test_an_amendment_may_not_touch_reads(prereg, capsys):
    freeze(capsys, prereg)
    prereg.write_text(prereg.read_text() + '\n[[amendments]]\ntext = "x"\nreads = []\n')
    code, _, err = cli(capsys, "prereg", "freeze", str(prereg))
    assert code == 2 and "never amended" in err


def test_a_verification_note_is_appended_to_the_record(prereg, capsys):
    code, _, err = cli(capsys, "prereg", "note", str(prereg), "banner read 880")
    assert code == 2 and "not frozen" in err
    freeze(capsys, prereg)
    code, _, _ = cli(capsys, "prereg", "note", str(prereg), "banner read 880")
    assert code == 0
    (note,) = [e for e in read_record(record_path_for(prereg)) if e["event"] == "note"]
    assert note["text"] == "banner read 880"


def test_an_ab_prereg_is_not_a_run_prereg():
    from levers.ab.prereg import template as ab_template

    with pytest.raises(PreregError, match="not a run pre-registration"):
        parse_run_prereg(ab_template({"baseline": "demo"}))


def test_compare_runs_a_frozen_read_and_appends_it_to_the_record(prereg, capsys, tmp_path):
    ids = np.arange(8)
    np.savez(tmp_path / "parent.npz", id=ids, eval_loss=np.full(8, 2.0))
    np.savez(tmp_path / "this.npz", id=ids, eval_loss=np.full(8, 1.5))
    code, _, err = cli(capsys, "compare", "--prereg", str(prereg), "--read", "1")
    assert code == 2 and "not frozen" in err
    freeze(capsys, prereg)
    code, out, err = cli(
        capsys,
        "compare",
        "--prereg",
        str(prereg),
        "--read",
        "1",
        "--resamples",
        "200",
    )
    assert code == 0, err
    assert out.startswith("read 1 (primary): IMPROVED if CI95 entirely below 0")
    events = read_record(record_path_for(prereg))
    assert events[-1]["event"] == "compare" and events[-1]["verdict"] == "IMPROVED"
    assert events[-1]["read"]["id"] == 1 and events[-1]["prereg"]["sha256"] == events[0]["sha256"]
    code, _, err = cli(capsys, "compare", "--prereg", str(prereg), "--read", "1", "--metric", "acc")
    assert code == 2 and "contradict read 1" in err
    json.dumps(events)  # the record stays plain JSON
