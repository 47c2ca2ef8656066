"""The audit's printed ``levers ab`` command names the workload as given, not the capture's label."""

from __future__ import annotations

import shlex
import subprocess
import sys

import pytest

from levers.cli import main


def test_the_printed_ab_command_names_the_spec_without_the_memory_model(capsys):
    code = main(["audit", "llama", "--warmup", "0", "--timed", "1", "--no-memory-model",
                 "--no-benchmark"])
    out = capsys.readouterr().out
    assert code == 0
    line = next(l for l in out.splitlines() if "prove it on your step:" in l)
    command = shlex.split(line.split("prove it on your step:", 1)[1])
    assert command[:3] == ["levers", "ab", "llama"]


def _printed_command(out: str) -> list[str]:
    line = next(l for l in out.splitlines() if "prove it on your step:" in l)
    return shlex.split(line.split("prove it on your step:", 1)[1])


@pytest.mark.slow
@pytest.mark.parametrize("workload", ["demo", "llama"])
def test_the_audits_printed_ab_command_runs_as_printed(workload, tmp_path):
    audit = subprocess.run(
        [sys.executable, "-m", "levers", "audit", workload], cwd=tmp_path, capture_output=True,
        text=True, timeout=600,
    )
    assert audit.returncode == 0, audit.stderr[-2000:]
    command = _printed_command(audit.stdout)
    assert command[:2] == ["levers", "ab"]
    ab = subprocess.run(
        [sys.executable, "-m", "levers", *command[1:]], cwd=tmp_path, capture_output=True,
        text=True, timeout=600,
    )
    assert ab.returncode == 0, (command, ab.stderr[-2000:])
