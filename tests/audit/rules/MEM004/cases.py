"""MEM004 fixtures: a 789k-parameter MLP whose AdamW keeps 6.02 MiB of float32 moments.

With a batch of 4 the moments are about half the captured peak (fire_adamw: no prediction, so
not recommended); with hand-made memory-model predictions (CONFIG's ``memory``, what
``levers audit`` passes from levers memory and its optimizer-state what-ifs) of a step that
binds memory (recommended) and one that does not (regress_throughput_bound: not recommended).
It stays quiet for SGD, for bf16 parameters (bf16 moments), for a state one of the levers holds
already (emulated by TRANSFORM: torchao's 8-bit moments as the capture records them), for
activations that dwarf the state, and under DDP over 4 ranks, where DIST004 fires."""

# fmt: off
# (the cases are laid out by hand: tests find the lines marked `# mark: <case>`)

import dataclasses

import torch
from ddp_in_process import ddp, relabel_world

from levers import Workload
from levers.audit.config import PredictedMemory

GIB = 1 << 30


def _workload(make_optimizer, *, rows=4, dtype=torch.float32, wrap=False):
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(3)]).to(dtype)
    if wrap:
        model = ddp(model)
    opt = make_optimizer(model.parameters())
    x = torch.randn(rows, 512, dtype=dtype)

    def step():
        model(x).float().pow(2).mean().backward()
        opt.step()  # mark: fire_adamw fire_adamw_memory_bound
        opt.zero_grad()

    return Workload(model=model, step=step, optimizer=opt, name="mem004")


def _adamw(params):
    return torch.optim.AdamW(params, lr=1e-3)


def fire_adamw():
    return _workload(_adamw)


def fire_adamw_memory_bound():
    return _workload(_adamw)


def regress_throughput_bound():
    return _workload(_adamw)


def ok_sgd():
    return _workload(lambda p: torch.optim.SGD(p, lr=1e-3, momentum=0.9))


def ok_bf16_parameters():
    return _workload(_adamw, dtype=torch.bfloat16)


def ok_state_already_8bit():
    return _workload(_adamw)


def ok_activations_dominate():
    return _workload(_adamw, rows=8192)


def ok_ddp_four_ranks():
    return _workload(_adamw, wrap=True)


def _as_8bit(capture):
    """The capture as if adamw-8bit held the state: the quantized moments of the six tensors of
    512 * 512 or 512 values (torchao keeps the biases' fp32), as the capture records them."""
    optimizer = dict(capture.settings["optimizer"])
    optimizer["moment_bytes"] = {"OptimState8bit": 4 * (512 * 512 + 4 * 1024 + 1024), "float32": 6 * 2048}
    optimizer["float32_moment_numels"] = [512] * 6
    return dataclasses.replace(capture, settings={**capture.settings, "optimizer": optimizer})


# levers memory's prediction of the step at a training size on an H100: 20 GiB of moments
BOUND = PredictedMemory(
    gpu="h100-80gb", usable_bytes=79 * GIB, num_steps=2, peak_allocated_bytes=70 * GIB,
    peak_reserved_bytes=73 * GIB, activation_bytes=25 * GIB, checkpointing_applicable=False,
    optimizer_bytes=20 * GIB, bf16_state_delta_allocated_bytes=-10 * GIB,
    int8_state_delta_allocated_bytes=-15 * GIB,
)
FREE = dataclasses.replace(BOUND, peak_allocated_bytes=50 * GIB, peak_reserved_bytes=52 * GIB)

CONFIG = {
    "fire_adamw_memory_bound": {"memory": BOUND},
    "regress_throughput_bound": {"memory": FREE},
}
TRANSFORM = {
    "ok_state_already_8bit": _as_8bit,
    "ok_ddp_four_ranks": relabel_world(4),
}
