"""The one environment record and the one reader of a git commit (capture, ab and tune share
them); ``LEVERS_COMMIT`` names a commit, ``LEVERS_GIT_COMMIT`` is read as its older spelling."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from levers import environment as env_mod
from levers.environment import Commit, Environment, declared_commit, environment, read_commit

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def test_the_declared_commit_is_read_from_levers_commit():
    assert declared_commit({"LEVERS_COMMIT": " abc123 "}) == Commit(
        "abc123", None, declared_by="LEVERS_COMMIT"
    )


def test_the_older_spelling_is_still_read_and_the_new_one_wins():
    assert declared_commit({"LEVERS_GIT_COMMIT": "old1"}) == Commit(
        "old1", None, declared_by="LEVERS_GIT_COMMIT"
    )
    both = {"LEVERS_GIT_COMMIT": "old1", "LEVERS_COMMIT": "new2"}
    assert declared_commit(both).commit == "new2"
    assert declared_commit({"LEVERS_COMMIT": "  "}) is None


def _git(cwd: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-c", "user.email=t@t", "-c", "user.name=t", *args],
        cwd=cwd, capture_output=True, text=True, check=True,
    )
    return done.stdout.strip()


def _repo(path: Path) -> str:
    """A git checkout at ``path`` with one commit; its id."""
    _git(path, "init", "-q")
    (path / "a.txt").write_text("one\n")
    _git(path, "add", "a.txt")
    _git(path, "commit", "-q", "-m", "one")
    return _git(path, "rev-parse", "HEAD")


@needs_git
def test_the_reader_gives_the_checked_out_commit_and_whether_the_tree_is_dirty(tmp_path):
    head = _repo(tmp_path)
    assert read_commit(tmp_path) == Commit(head, False)
    (tmp_path / "a.txt").write_text("two\n")
    assert read_commit(tmp_path) == Commit(head, True)


@needs_git
def test_outside_a_checkout_there_is_no_commit(tmp_path):
    assert read_commit(tmp_path) is None


def test_a_declared_commit_is_the_levers_commit_of_every_record(monkeypatch):
    monkeypatch.setenv("LEVERS_COMMIT", "0123456789abcdef")
    env_mod.levers_commit.cache_clear()
    try:
        record = environment("cpu")
        assert env_mod.levers_commit_id() == "0123456789ab"
    finally:
        env_mod.levers_commit.cache_clear()
    assert record["levers_commit"] == "0123456789abcdef"
    assert record["levers_commit_dirty"] is None


def test_the_record_has_exactly_the_keys_of_its_type():
    record = environment("cpu")
    assert set(record) == set(Environment.__annotations__)
    assert record["device"] == "cpu" and record["gpu"] is None
    assert record["device_name"] == record["cpu"]
    assert record["workdir_commit"] is None  # asked for with cwd= only


@needs_git
def test_the_working_directory_commit_is_read_when_asked(tmp_path):
    head = _repo(tmp_path)
    record = environment("cpu", cwd=tmp_path)
    assert record["workdir_commit"] == {"commit": head, "dirty": False, "declared_by": None}


def test_a_capture_carries_the_same_record():
    import torch

    from levers import Workload
    from levers.capture import capture_step

    model = torch.nn.Linear(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(5, 4)

    def step() -> torch.Tensor:
        loss = model(x).sum()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    capture = capture_step(Workload(model=model, step=step, optimizer=opt), warmup=0, timed=0)
    assert set(capture.env) == set(Environment.__annotations__)
