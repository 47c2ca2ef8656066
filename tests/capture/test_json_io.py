"""levers.capture.json_io: the --json file and how it is written."""

from __future__ import annotations

import json
import os

import pytest

from levers.capture.records import SCHEMA_VERSION
from levers.errors import LeversError
from levers.capture.json_io import SCHEMA, read_capture, write_capture

from hand_capture import make_calls, make_capture


def test_round_trip(tmp_path, capture):
    path = tmp_path / "step.json"
    write_capture(capture, path)
    data = json.loads(path.read_text())
    assert data["schema"] == f"levers.capture/{SCHEMA_VERSION}" == SCHEMA
    assert next(iter(data)) == "schema"
    assert data["schema_version"] == SCHEMA_VERSION
    assert len(data["ops"]) == 6
    assert data["ops"][0]["source"] == {
        "file": "/home/me/proj/model.py",
        "line": 10,
        "function": "f",
        "code": "y = x @ self.w",
    }
    assert read_capture(path) == capture


def test_non_json_call_args_become_strings(tmp_path):
    import torch

    calls = make_calls() + (
        make_calls()[0].__class__(
            index=9,
            kind="sdpa",
            name="scaled_dot_product_attention",
            phase="forward",
            module=None,
            source=None,
            args={"dtype": torch.bfloat16, "fill": float("-inf")},
            first_op=None,
            last_op=None,
        ),
    )
    path = tmp_path / "step.json"
    write_capture(make_capture(calls=calls), path)
    loaded = read_capture(path)
    assert loaded.calls[-1].args == {"dtype": "torch.bfloat16", "fill": "-inf"}
    json.loads(path.read_text(), parse_constant=pytest.fail)  # strict JSON: no NaN/Infinity


def test_read_rejects_other_files(tmp_path):
    path = tmp_path / "other.json"
    path.write_text('{"hello": 1}')
    with pytest.raises(LeversError, match="is not a levers capture"):
        read_capture(path)
    path.write_text("{not json")
    with pytest.raises(LeversError, match="cannot read capture file"):
        read_capture(path)
    with pytest.raises(LeversError, match="does not exist; write one with levers audit --json"):
        read_capture(tmp_path / "missing.json")


def test_read_rejects_other_schema_version(tmp_path, capture):
    path = tmp_path / "step.json"
    write_capture(capture, path)
    data = json.loads(path.read_text())
    data["schema"] = "levers.capture/999"
    path.write_text(json.dumps(data))
    with pytest.raises(LeversError, match="re-capture the step with this version of levers"):
        read_capture(path)


def test_write_into_missing_directory_fails_clearly(tmp_path, capture):
    with pytest.raises(LeversError, match="directory .* does not exist; create it first"):
        write_capture(capture, tmp_path / "nope" / "step.json")


def test_failed_write_keeps_previous_file(tmp_path, capture):
    path = tmp_path / "step.json"
    path.write_text("previous content\n")

    class Unserializable:
        def __str__(self):
            raise RuntimeError("disk full")  # fails midway through json.dump

    bad = make_capture(workload_params={"a": 1, "b": Unserializable()})
    with pytest.raises(RuntimeError, match="disk full"):
        write_capture(bad, path)
    assert path.read_text() == "previous content\n"
    assert os.listdir(tmp_path) == ["step.json"]  # the temporary file is gone
