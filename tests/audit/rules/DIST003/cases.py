"""DIST003 fixtures: an MLP in DDP over a one-rank gloo group in this process, its step under
CPU bf16 autocast (as a GPU step would run under CUDA bf16 autocast)."""

# fmt: off
# (the cases are laid out by hand: tests find the lines marked `# mark: <case>`)

import torch
from ddp_in_process import ddp
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from levers import Workload


def _workload(*, autocast=True, hook=None):
    torch.manual_seed(0)
    model = ddp(torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Linear(32, 32)))
    if hook is not None:
        model.register_comm_hook(model.process_group, hook)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(4, 32)

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = model(x).float().pow(2).mean()  # mark: fire_bf16_autocast
        loss.backward()
        opt.step()
        opt.zero_grad()

    return Workload(model=model, step=step, optimizer=opt, name="dist003")


def fire_bf16_autocast():
    return _workload()


def ok_fp32_step():
    return _workload(autocast=False)


def ok_with_a_hook():
    # bf16_compress_hook needs NCCL; any registered hook decides what travels
    return _workload(hook=default_hooks.allreduce_hook)
