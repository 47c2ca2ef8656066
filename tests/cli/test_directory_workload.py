"""``levers audit adir`` and ``levers audit adir/`` give one message for one directory."""

from __future__ import annotations

import pytest

from levers.errors import WorkloadNotFound
from levers.loader import load_workload


def _message(spec: str) -> str:
    with pytest.raises(WorkloadNotFound) as caught:
        load_workload(spec)
    return str(caught.value)


def test_a_directory_with_or_without_its_slash_gets_one_message(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "adir").mkdir()
    plain, slashed = _message("adir"), _message("adir/")
    assert "is a directory" in plain
    assert plain.replace("'adir/'", "'adir'") == slashed.replace("'adir/'", "'adir'")
