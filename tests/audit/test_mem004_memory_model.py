"""MEM004's figures: the capture's record of Adam's moments, and the memory model's prediction
of the optimizer-state what-ifs, which must agree with the arithmetic MEM004 does on the capture
when there is no prediction."""

from __future__ import annotations

from pathlib import Path

import torch

from levers.adam_state import bf16_freed_bytes, int8_freed_bytes
from levers.audit.config import predicted_memory_from_plan
from levers.capture.env import _optimizer_info
from levers.memory import predict_memory

CASES = Path(__file__).parent / "rules" / "MEM004" / "cases.py"


def _stepped(dtype):
    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.Linear(512, 64)).to(dtype)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, 512, dtype=dtype)).float().sum().backward()
    optimizer.step()
    return optimizer


def test_the_capture_records_the_moments_by_form_and_the_float32_sizes():
    record = _optimizer_info(_stepped(torch.float32))
    numels = [512 * 512, 512 * 512, 512, 512, 512 * 64, 512 * 64, 64, 64]
    assert sorted(record["float32_moment_numels"]) == sorted(numels)
    assert record["moment_bytes"] == {"float32": 4 * sum(numels)}
    # the step counters (scalars) are state, not moments
    assert record["state_bytes"] > record["moment_bytes"]["float32"]
    bf16 = _optimizer_info(_stepped(torch.bfloat16))
    assert set(bf16["moment_bytes"]) == {"bfloat16"} and bf16["float32_moment_numels"] == []


def test_the_predicted_drops_are_the_capture_arithmetic():
    plan = predict_memory(f"{CASES}:fire_adamw", gpu="h100", whatifs=True)
    memory = predicted_memory_from_plan(plan)
    numels = [512 * 512, 512] * 6
    assert memory.optimizer_bytes >= 4 * sum(numels)
    assert memory.bf16_state_delta_allocated_bytes == -bf16_freed_bytes(numels) == -3151872
    assert memory.int8_state_delta_allocated_bytes == -int8_freed_bytes(numels) == -4687872
