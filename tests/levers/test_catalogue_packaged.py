"""The measured catalogue ships inside the package: an installation without the repository's
bench/results (pip install ., a wheel) reads the same rows (issue 34)."""

from __future__ import annotations

import json

import levers.levers.catalogue as catalogue
from levers.levers.catalogue import PACKAGED, read_catalogue, repository_paths


def test_the_packaged_rows_are_the_repository_s_rows():
    repo = [row for path in repository_paths() for row in read_catalogue(path)]
    assert repo, "the repository's bench/results hold no catalogue"
    # if this fails, a benchmark added results: python -m levers.levers.catalogue
    assert read_catalogue(PACKAGED) == repo


def test_without_the_repository_the_packaged_catalogue_is_read(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(catalogue, "_REPO_RESULTS", tmp_path / "no-bench-results")
    monkeypatch.delenv(catalogue.ENV, raising=False)
    assert catalogue.catalogue_paths() == [PACKAGED]
    assert len(read_catalogue()) == len(json.loads(PACKAGED.read_text())["rows"]) > 0
    from levers.cli import main

    assert main(["list"]) == 0
    out = capsys.readouterr().out
    # as from the repository: the same levers measured (an install without the rows said "not
    # measured" for all 25)
    monkeypatch.undo()
    assert main(["list"]) == 0
    assert out == capsys.readouterr().out
    assert out.count("measured: not measured") < 10
