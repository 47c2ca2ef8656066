"""MEM003 fixtures: one small step audited with hand-made memory-model predictions (CONFIG's
``memory``, what ``levers audit`` passes from levers memory and its fit of ``batch_size``): much
memory free and a fit 8x the batch; memory nearly full; no fit searched; a fit barely larger."""

# fmt: off
# (the cases are laid out by hand: tests find the lines marked `# mark: <case>`)

import dataclasses

import torch

from levers import Workload
from levers.audit.config import PredictedMemory

GIB = 1 << 30


def _workload():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step():
        x = torch.randn(4, 64)  # mark: fire_headroom
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()

    return Workload(model=model, step=step, optimizer=opt, name="mem003", params={"batch_size": 4})


FREE = PredictedMemory(
    gpu="h100-80gb", usable_bytes=79 * GIB, num_steps=2, peak_allocated_bytes=9 * GIB,
    peak_reserved_bytes=10 * GIB, activation_bytes=6 * GIB, checkpointing_applicable=False,
    batch_param="batch_size", batch_now=4, batch_fit=32, fit_budget_bytes=75 * GIB,
)
FULL = dataclasses.replace(FREE, peak_reserved_bytes=76 * GIB, batch_fit=4)

fire_headroom = _workload
ok_memory_full = _workload
ok_no_fit = _workload
ok_fit_barely_larger = _workload

CONFIG = {
    "fire_headroom": {"memory": FREE},
    "ok_memory_full": {"memory": FULL},
    "ok_no_fit": {"memory": dataclasses.replace(FREE, batch_fit=None)},
    "ok_fit_barely_larger": {"memory": dataclasses.replace(FREE, batch_fit=4)},
}
