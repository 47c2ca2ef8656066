"""The append-only record (its atomic writer is levers.output.atomic: tests/output/test_atomic.py)."""

from __future__ import annotations

import json

import pytest

from levers.ab.record import append_event, read_record, record_path_for
from levers.errors import LeversError


def test_record_path_sits_beside_the_preregistration(tmp_path):
    assert record_path_for(tmp_path / "x.toml") == tmp_path / "x.toml.record.jsonl"


def test_appending_twice_gives_two_lines_and_keeps_the_first(tmp_path):
    path = tmp_path / "r.jsonl"
    append_event(path, {"event": "result", "n": 1})
    first = path.read_bytes()
    append_event(path, {"event": "result", "n": 2, "x": float("nan")})
    data = path.read_bytes()
    assert data.startswith(first)
    lines = data.decode().splitlines()
    assert len(lines) == 2
    assert json.loads(lines[0]) == {"schema": 1, "event": "result", "n": 1}
    assert [e["n"] for e in read_record(path)] == [1, 2]


def test_a_line_that_is_not_json_is_reported_with_its_number(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text('{"event": "freeze"}\nnot json\n')
    with pytest.raises(LeversError, match="r.jsonl:2 is not JSON"):
        read_record(path)


def test_no_record_reads_as_empty(tmp_path):
    assert read_record(tmp_path / "none.jsonl") == []
