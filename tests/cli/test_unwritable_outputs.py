"""A path that cannot be written is the user's error (exit 2, which path and why), not exit 70."""

from __future__ import annotations

import numpy as np
import pytest

from levers.ab.record import append_event
from levers.cli import main
from levers.errors import LeversError
from levers.output.atomic import atomic_write_text


@pytest.fixture
def blocked(tmp_path):
    """A path whose parent is a file: no directory can be made there."""
    (tmp_path / "afile").write_text("x")
    return tmp_path / "afile" / "out"


def test_atomic_write_into_an_impossible_directory_is_a_levers_error(blocked):
    with pytest.raises(LeversError, match="cannot write"):
        atomic_write_text(blocked, "text", make_parents=True)
    with pytest.raises(LeversError, match="cannot write"):
        atomic_write_text(blocked, "text")


def test_atomic_write_to_a_directory_is_a_levers_error(tmp_path):
    with pytest.raises(LeversError, match="it is a directory"):
        atomic_write_text(tmp_path, "text")


def test_rule_all_output_into_an_impossible_directory_exits_2(blocked, capsys):
    assert main(["rule", "--all", "--output", str(blocked / "rules.md")]) == 2
    assert "cannot write" in capsys.readouterr().err


def test_prereg_init_into_an_impossible_directory_exits_2(blocked, capsys):
    assert main(["prereg", "init", str(blocked / "p.md")]) == 2
    assert "cannot write" in capsys.readouterr().err


def test_prereg_init_says_wrote_once(tmp_path, capsys):
    assert main(["prereg", "init", str(tmp_path / "p.md")]) == 0
    out, err = capsys.readouterr()
    lines = (out + err).splitlines()
    assert sum(line.startswith("wrote") or ": wrote" in line for line in lines) == 1
    assert sum("wrote " in line.split(str(tmp_path))[0] for line in lines) == 1


def _metric_files(tmp_path):
    ids = np.arange(20)
    np.savez(tmp_path / "a.npz", loss=ids / 10.0, id=ids)
    np.savez(tmp_path / "b.npz", loss=ids / 10.0 + 0.01, id=ids)
    return str(tmp_path / "a.npz"), str(tmp_path / "b.npz")


@pytest.mark.parametrize("flag", ["--json", "--md"])
def test_compare_output_that_cannot_be_written_exits_2(tmp_path, blocked, flag, capsys):
    a, b = _metric_files(tmp_path)
    assert main(["compare", a, b, "--metric", "loss", flag, str(blocked / "x")]) == 2
    assert "cannot write" in capsys.readouterr().err
    assert main(["compare", a, b, "--metric", "loss", flag, str(tmp_path)]) == 2


def test_compare_prints_its_read_before_a_write_fails(tmp_path, monkeypatch, capsys):
    import levers.cli.compare as compare_cli
    import levers.output.atomic as atomic

    a, b = _metric_files(tmp_path)

    def fail(path, *args, **kwargs):
        raise atomic.unwritable(path, OSError(28, "No space left on device"))

    monkeypatch.setattr(compare_cli, "atomic_write_text", fail)
    assert main(["compare", a, b, "--metric", "loss", "--json", str(tmp_path / "c.json")]) == 2
    out, err = capsys.readouterr()
    assert "verdict" in out and "No space left" in err


def test_a_record_path_that_is_a_directory_is_a_levers_error(tmp_path):
    with pytest.raises(LeversError, match="directory"):
        append_event(tmp_path, {"event": "x"})


def test_compare_labels_its_means_with_the_examples_compared(tmp_path, capsys):
    ids = np.arange(20)
    np.savez(tmp_path / "a.npz", loss=ids / 10.0, id=ids)
    np.savez(tmp_path / "b.npz", loss=ids[2:] / 10.0, id=ids[2:])
    main(["compare", str(tmp_path / "a.npz"), str(tmp_path / "b.npz"), "--metric", "loss"])
    out = capsys.readouterr().out
    assert "20 rows, mean" in out and "over the 18 compared" in out


@pytest.mark.parametrize("flag", ["--json", "--md", "--html", "--trace", "--findings-json"])
def test_audit_output_that_cannot_be_written_exits_2_before_the_capture(blocked, flag, capsys):
    assert main(["audit", "demo", flag, str(blocked / "x")]) == 2
    out, err = capsys.readouterr()
    assert "cannot write" in err and out == ""  # refused before anything ran
