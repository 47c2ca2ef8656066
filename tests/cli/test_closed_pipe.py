"""A closed stdout (``levers list | head -1``) ends quietly with exit 0, whatever verb."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


def _into_closed_pipe(argv: list[str]) -> subprocess.CompletedProcess:
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader has gone before levers writes anything
    try:
        return subprocess.run(
            [sys.executable, "-m", "levers", *argv],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=300,
        )
    finally:
        os.close(write_end)


@pytest.mark.parametrize(
    "argv", [["list"], ["list", "--json"], ["rule", "ATTN001"]], ids=" ".join
)
def test_closed_stdout_ends_quietly(argv):
    done = _into_closed_pipe(argv)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""


def test_closed_stdout_during_an_audit_ends_quietly():
    done = _into_closed_pipe(["audit", "demo", "--warmup", "0", "--timed", "1", "--no-benchmark",
                              "--no-memory-model"])
    assert done.returncode == 0, done.stderr
    assert "sys.exit" not in done.stderr and "error" not in done.stderr
