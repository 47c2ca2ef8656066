"""Hardening, round three: a full disk, a model on the meta device, the root module's name."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import levers
from levers import Workload
from levers.cli import main
from levers.errors import LeversError


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_a_full_disk_on_stdout_is_exit_2_with_what_happened():
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [sys.executable, "-m", "levers", "list"], stdout=full, stderr=subprocess.PIPE,
            text=True, env=dict(os.environ),
        )
    assert done.returncode == 2, done.stderr
    assert "cannot write (standard output): No space left on device" in done.stderr
    assert "internal error" not in done.stderr


def _meta_workload() -> Workload:
    with torch.device("meta"):
        model = torch.nn.Linear(8, 8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(2, 8, device="meta")

    def step():
        loss = model(x).sum()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    return Workload(model=model, step=step, optimizer=optimizer)


def test_a_model_on_the_meta_device_is_refused_before_its_step_runs():
    with pytest.raises(LeversError, match="the model is on the meta device"):
        levers.Step(_meta_workload()).capture()


def test_the_root_module_is_named_the_model_not_outside_it(tmp_path, capsys):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""\
        import torch

        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = torch.nn.Linear(8, 8)

            def forward(self, x):
                wide = self.lin(x).repeat(1, 4096)  # the root's own op holds the step's peak
                return (wide * wide).mean()

        model = Net()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(6):
            loss = model(torch.ones(16, 8))
            loss.backward(); opt.step(); opt.zero_grad()
    """))
    assert main(["memory", "--", "python", str(script)]) == 0
    out = capsys.readouterr().out
    assert "module <model>)" in out and "<outside model>" not in out  # defects N14, N5
