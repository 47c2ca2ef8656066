"""Ctrl-C in ``levers ab`` without --json: "the partial result is kept" names a file that exists."""

from __future__ import annotations

import json

from levers.cli import ab as ab_cli


def test_a_stopped_run_without_json_is_kept_in_a_fallback_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    where = ab_cli._kept_in([], json.dumps({"partial": True}) + "\n")
    kept = list(tmp_path.glob("levers-ab-result-*.json"))
    assert len(kept) == 1 and str(kept[0]) in where
    assert json.loads(kept[0].read_text()) == {"partial": True}


def test_a_stopped_run_with_json_names_the_files_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert ab_cli._kept_in(["out.json"], "{}\n") == "out.json"
    assert not list(tmp_path.glob("levers-ab-result-*.json"))
