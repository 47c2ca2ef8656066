"""DDP in the test process itself, over a one-rank gloo group on an in-memory store.

DDP's reducer then runs exactly as on a real rank: one all-reduce per gradient bucket in
backward, recorded by the capture as ``c10d.allreduce_`` ops with the bucket's flat shape. The
default group exists only while DDP is built (DDP keeps its own reference to the group), so no
other test sees a process group.
"""

from __future__ import annotations

import dataclasses
import datetime

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def ddp(module: torch.nn.Module, **kwargs) -> DistributedDataParallel:
    assert not dist.is_initialized(), "a test left a default process group behind"
    dist.init_process_group(
        "gloo", store=dist.HashStore(), rank=0, world_size=1, timeout=datetime.timedelta(seconds=30)
    )
    try:
        return DistributedDataParallel(module, **kwargs)
    finally:
        dist.destroy_process_group()


def relabel_world(world_size: int):
    """A transform: the capture as if it had run on ``world_size`` ranks."""

    def transform(capture):
        info = dict(capture.settings.get("distributed") or {})
        info["world_size"] = world_size
        if info.get("ddp"):
            info["ddp"] = {**info["ddp"], "world_size": world_size}
        return dataclasses.replace(capture, settings={**capture.settings, "distributed": info})

    return transform
