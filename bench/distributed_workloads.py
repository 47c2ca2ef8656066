"""The ``hf`` llama under DDP or FSDP2, one rank per process, for levers under torchrun.

    torchrun --nproc_per_node=2 -m levers audit bench/distributed_workloads.py:hf_parallel \
        --set strategy=ddp size=1b

The factory initialises the default process group from torchrun's environment (NCCL on CUDA,
gloo on a CPU), builds the ``hf`` workload on this rank's device, wraps it (``ddp``: DDP with
its defaults; ``fsdp2``: ``fully_shard`` on every decoder layer and on the root, as PyTorch's
recipe does) and builds AdamW after the wrapping (FSDP2 replaces the parameters by shards).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import torch
import torch.distributed as dist

from levers import Workload
from levers.workloads import _runtime, hf
from levers.workloads.llama import SIZES

STRATEGIES = ("ddp", "fsdp2")


def _init(device_type: str) -> torch.device:
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device_type == "cuda" else "gloo")
    if device_type == "cuda":
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def wrap(model: torch.nn.Module, strategy: str, device: torch.device) -> torch.nn.Module:
    if strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        ids = [device.index] if device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids)
    from torch.distributed.fsdp import fully_shard

    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    return model


def hf_parallel(
    strategy: str = "ddp",
    size: str = "tiny",
    device: str = "cuda",
    batch_size: Any = None,
    seq_len: Any = None,
) -> Workload:
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
    rank_device = _init(torch.device(device).type)
    base = hf.build(
        size=size, device=str(rank_device), seed=dist.get_rank(), batch_size=batch_size,
        seq_len=seq_len,
    )
    model = wrap(base.model, strategy, rank_device)
    optimizer = _runtime.adamw(model, lr=hf.LEARNING_RATE)
    shapes = SIZES[size]
    shapes = dataclasses.replace(
        shapes, batch_size=base.params["batch_size"], seq_len=base.params["seq_len"]
    )
    generator = _runtime.data_generator(dist.get_rank(), rank_device)
    return Workload(
        model=model,
        step=hf.training_step(model, optimizer, shapes, generator),
        tokens_per_step=base.tokens_per_step,
        optimizer=optimizer,
        name=f"{base.name}-{strategy}",
        params={**base.params, "strategy": strategy, "world_size": dist.get_world_size()},
        device=rank_device,
    )
