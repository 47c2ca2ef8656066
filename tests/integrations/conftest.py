"""Helpers for running the fixture scripts under ``levers audit -- python ...``."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "tests" / "fixtures" / "scripts"


def line_of(script: Path, text: str) -> int:
    """The 1-based line of ``script`` that contains ``text`` (exactly one)."""
    lines = [i for i, line in enumerate(script.read_text().splitlines(), 1) if text in line]
    assert len(lines) == 1, (text, lines)
    return lines[0]


def run_levers(*argv: str, cwd: Path = REPO, timeout: int = 300) -> subprocess.CompletedProcess:
    # a wide console: a long temporary path (pytest-xdist's popen-gwN folders) is not wrapped
    # into the lines a test reads
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"), LEVERS_DEBUG="", COLUMNS="400")
    env.pop("LEVERS_DEBUG")
    return subprocess.run(
        [sys.executable, "-m", "levers.cli", *argv],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
    )


def receipts_by_code(findings_json: Path) -> dict[str, set[tuple[str, int]]]:
    report = json.loads(findings_json.read_text())
    out: dict[str, set[tuple[str, int]]] = {}
    for finding in report["findings"]:
        for receipt in finding["receipts"]:
            out.setdefault(finding["code"], set()).add(
                (os.path.basename(receipt["file"] or ""), receipt["line"])
            )
    return out


def needs(module: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(
        importlib.util.find_spec(module) is None,
        reason=f"needs {module} (pip install -e '.[test]' installs it)",
    )
