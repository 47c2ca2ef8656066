"""The audit's printed ``levers ab`` command names the workload as given, not the capture's label."""

from __future__ import annotations

import shlex

from levers.cli import main


def test_the_printed_ab_command_names_the_spec_without_the_memory_model(capsys):
    code = main(["audit", "llama", "--warmup", "0", "--timed", "1", "--no-memory-model",
                 "--no-benchmark"])
    out = capsys.readouterr().out
    assert code == 0
    line = next(l for l in out.splitlines() if "prove it on your step:" in l)
    command = shlex.split(line.split("prove it on your step:", 1)[1])
    assert command[:3] == ["levers", "ab", "llama"]
