"""Output files go where levers was started, even when the script changes directory (defect
N9), and the path printed is the one written."""

from __future__ import annotations

import os
import textwrap

import pytest

from levers.cli import main
from levers.cli.options import STDOUT, output_path

SCRIPT = """\
import os, torch
os.chdir({elsewhere!r})
model = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for i in range(8):
    loss = model(torch.ones(4, 8)).pow(2).mean()
    loss.backward(); opt.step(); opt.zero_grad()
"""


def test_relative_outputs_are_written_where_levers_started(tmp_path, monkeypatch, capsys):
    start, elsewhere = tmp_path / "start", tmp_path / "elsewhere"
    start.mkdir(), elsewhere.mkdir()
    script = start / "train.py"
    script.write_text(SCRIPT.format(elsewhere=str(elsewhere)))
    monkeypatch.chdir(start)
    try:
        code = main(["audit", "--json", "out.json", "--trace", "t.json", "--findings-json",
                     "f.json", "--", "python", str(script)])
    finally:
        os.chdir(start)
    assert code == 0
    for name in ("out.json", "t.json", "f.json"):
        assert (start / name).is_file(), name
        assert not (elsewhere / name).exists(), name
    assert f"wrote the capture to {start / 'out.json'}" in capsys.readouterr().err


def test_output_path_is_absolute_and_dash_stays_stdout(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert output_path("a/b.json") == tmp_path / "a" / "b.json"
    assert output_path("-") == STDOUT
    assert output_path("/x/y.json").as_posix() == "/x/y.json"
