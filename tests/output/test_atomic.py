"""levers.output.atomic: the one writer of every file levers writes."""

from __future__ import annotations

import os

import pytest

from levers.errors import LeversError
from levers.output import atomic
from levers.output.atomic import atomic_write_text


def write_atomic(path, text, **options):
    """The writer as levers ab calls it: missing directories are created."""
    atomic_write_text(path, text, make_parents=True, **options)


def test_atomic_open_failure_midway_keeps_previous_file(tmp_path):
    path = tmp_path / "out.txt"
    atomic.atomic_write_text(path, "old")
    with pytest.raises(KeyboardInterrupt), atomic.atomic_open(path) as f:
        f.write("new, half written")
        f.flush()
        raise KeyboardInterrupt
    assert path.read_text() == "old"
    assert sorted(os.listdir(tmp_path)) == ["out.txt"]


def test_atomic_replace_keeps_mode(tmp_path):
    path = tmp_path / "out.txt"
    path.write_text("old")
    os.chmod(path, 0o640)
    atomic.atomic_write_text(path, "new")
    assert path.read_text() == "new"
    assert os.stat(path).st_mode & 0o777 == 0o640


def test_atomic_new_file_follows_umask(tmp_path):
    old = os.umask(0o022)
    try:
        atomic.atomic_write_text(tmp_path / "new.txt", "x")
    finally:
        os.umask(old)
    assert os.stat(tmp_path / "new.txt").st_mode & 0o777 == 0o644


def test_write_atomic_replaces_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "out" / "a.json"
    write_atomic(path, "one")
    write_atomic(path, "two")
    assert path.read_text() == "two"
    assert sorted(p.name for p in path.parent.iterdir()) == ["a.json"]


def test_write_atomic_exclusive_refuses_an_existing_file(tmp_path):
    path = tmp_path / "a.toml"
    write_atomic(path, "first", exclusive=True)
    with pytest.raises(LeversError, match="already exists"):
        write_atomic(path, "second", exclusive=True)
    assert path.read_text() == "first"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.toml"]


def test_a_failed_exclusive_write_leaves_no_temporary(tmp_path):
    path = tmp_path / "a.toml"
    path.write_text("theirs")
    with pytest.raises(LeversError, match="already exists"):
        write_atomic(path, "mine", exclusive=True)
    assert path.read_text() == "theirs"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.toml"]


def test_an_exclusive_new_file_follows_umask(tmp_path):
    old = os.umask(0o027)
    try:
        write_atomic(tmp_path / "new.toml", "x", exclusive=True)
    finally:
        os.umask(old)
    assert os.stat(tmp_path / "new.toml").st_mode & 0o777 == 0o640
