"""float8 in a memory prediction: applied when the predicted GPU runs float8 matmuls (its compute
capability decides, not the machine's), and left out, with the reason in the plan and on the
terminal, when it does not; a prediction never passes for one with a lever it left out."""

from __future__ import annotations

import io

import pytest
import torch
from rich.console import Console

import levers
from levers import Workload
from levers.memory.render import render_plan

pytest.importorskip("torchao.float8", reason="torchao not installed (pip install torchao)")

WIDTH, HIDDEN, ROWS = 1024, 4096, 16384  # N = 4096 > 1024: both linears pass torchao's filter


def mlp(device: str = "cuda") -> Workload:
    model = torch.nn.Sequential(
        torch.nn.Linear(WIDTH, HIDDEN), torch.nn.GELU(), torch.nn.Linear(HIDDEN, WIDTH)
    ).to(device)
    optimizer = torch.optim.AdamW(model.parameters())
    x = torch.randn(ROWS, WIDTH, device=device)

    def step():
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
            loss = model(x).float().pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    return Workload(model=model, step=step, optimizer=optimizer)


def _activations(plan) -> int:
    return sum(c.nbytes for c in plan.by_category if c.category == "activations")


def test_float8_is_predicted_for_a_gpu_that_runs_it():
    step = levers.Step(mlp)
    eager = step.memory(gpu="h200", whatifs=False)
    float8 = step.memory(gpu="h200", whatifs=False, lever_ids=["float8"])
    assert "levers_skipped" not in float8.extra
    # the linears' saved inputs are float8 (1 byte) where autocast kept bf16 (2 bytes)
    assert _activations(float8) < _activations(eager)
    dtypes = {str(t.dtype) for t in float8.live_at_peak}
    assert any(d.startswith("float8") for d in dtypes), dtypes


def test_a_gpu_without_float8_gets_the_plan_without_it_and_says_why():
    step = levers.Step(mlp)
    eager = step.memory(gpu="a100", whatifs=False)
    plan = step.memory(gpu="a100", whatifs=False, lever_ids=["float8"])
    why = plan.extra["levers_skipped"]["float8"]
    assert "compute capability 8.9" in why and "8.0" in why
    assert plan.peak_allocated_bytes == eager.peak_allocated_bytes
    out = io.StringIO()
    render_plan(plan, Console(file=out, width=200))
    assert "not predicted with lever float8: float8 matmuls need" in out.getvalue()
