"""MEM001 fixtures: blocks whose activations dominate the step's memory, with and without
checkpointing, and a parameter-heavy step where they do not.

The same step is also audited with hand-made memory-model predictions (CONFIG's ``memory``, what
``levers audit`` passes from ``levers.memory.predict_memory``): a predicted headroom, a
prediction whose checkpointing what-if failed (the timeline estimate is used, and says why),
and a prediction in which checkpointing frees too little to report."""

# fmt: off
# (the cases are laid out by hand: tests find the lines marked `# mark: <case>`)

import torch
from torch.utils.checkpoint import checkpoint

from levers import Workload
from levers.audit.config import PredictedMemory


class Block(torch.nn.Module):
    def __init__(self, width=64, hidden=256):
        super().__init__()
        self.up = torch.nn.Linear(width, hidden)
        self.down = torch.nn.Linear(hidden, width)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(x)))


class Net(torch.nn.Module):
    def __init__(self, checkpointing=False, n=4, **block):
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block(**block) for _ in range(n))
        self.checkpointing = checkpointing

    def forward(self, x):
        for block in self.blocks:
            if self.checkpointing:
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)  # mark: fire_activations_dominate fire_predicted fire_whatif_failed fire_predicted_too_small fire_memory_bound fire_checkpointing_buys_batch
        return x


def _workload(batch, **net):
    torch.manual_seed(0)
    model = Net(**net)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(batch, 64)

    def step():
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return Workload(model=model, step=step, optimizer=opt, name="mem001")


def fire_activations_dominate():
    return _workload(512)


def ok_checkpointed():
    return _workload(512, checkpointing=True)


def ok_parameters_dominate():
    return _workload(2, hidden=4096)


def fire_predicted():
    return _workload(512)


def fire_whatif_failed():
    return _workload(512)


def fire_predicted_too_small():
    return _workload(512)


def fire_memory_bound():
    return _workload(512)  # the fire_predicted prediction on a GPU with 1 MiB to spare


def fire_checkpointing_buys_batch():
    return _workload(512)  # throughput-bound, but the fit without checkpointing is barely larger


MIB = 1 << 20
# usable bytes of an H100 80GB to the caching allocator (81559 MiB less 600 MiB of context)
H100_USABLE_BYTES = 80959 * MIB
PREDICTED = {
    "gpu": "h100-80gb",
    "usable_bytes": H100_USABLE_BYTES,
    "num_steps": 3,
    "peak_allocated_bytes": 8 * MIB,
    "peak_reserved_bytes": 22 * MIB,
    "activation_bytes": 2 * MIB + MIB // 4,
}
CONFIG = {
    "fire_predicted": {
        "memory": PredictedMemory(
            **PREDICTED,
            checkpointing_applicable=True,
            checkpointing_delta_allocated_bytes=-(3 * MIB // 2),
            checkpointing_delta_reserved_bytes=-2 * MIB,
            checkpointing_note="re-prediction with 4 blocks wrapped",
        )
    },
    "fire_whatif_failed": {
        "memory": PredictedMemory(
            **PREDICTED,
            checkpointing_applicable=False,
            checkpointing_note=(
                "failed: torch.utils.checkpoint: A different number of tensors was saved during "
                "the original forward and recomputation.\nNumber of tensors saved during forward: 34"
            ),
        )
    },
    "fire_predicted_too_small": {
        # 64 KiB is under 5% of the 2.25 MiB of predicted activations: reported at low severity
        "memory": PredictedMemory(
            **PREDICTED,
            checkpointing_applicable=True,
            checkpointing_delta_allocated_bytes=-64 * 1024,
            checkpointing_delta_reserved_bytes=0,
            checkpointing_note="re-prediction with 4 blocks wrapped",
        )
    },
    "fire_memory_bound": {
        "memory": PredictedMemory(
            **{**PREDICTED, "usable_bytes": 23 * MIB},
            checkpointing_applicable=True,
            checkpointing_delta_allocated_bytes=-(3 * MIB // 2),
            checkpointing_delta_reserved_bytes=-2 * MIB,
            checkpointing_note="re-prediction with 4 blocks wrapped",
        )
    },
    "fire_checkpointing_buys_batch": {
        # 4 samples fit without checkpointing, and the activations set the rest of the budget:
        # freeing 1.5 of their 2.25 MiB makes room for a far larger batch
        "memory": PredictedMemory(
            **{**PREDICTED, "usable_bytes": 40 * MIB},
            checkpointing_applicable=True,
            checkpointing_delta_allocated_bytes=-(3 * MIB // 2),
            checkpointing_delta_reserved_bytes=-2 * MIB,
            checkpointing_note="re-prediction with 4 blocks wrapped",
            batch_param="batch_size",
            batch_now=4,
            batch_fit=5,
            fit_budget_bytes=38 * MIB,
        )
    },
}
