"""The distribution a capture ran under: world size and rank, and how the model is wrapped.

Read after the step, from the environment torchrun sets (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``), the default process group when one exists, and the model's own modules: a
``DistributedDataParallel`` wrapper (its bucket cap, ``find_unused_parameters``, comm hook) or
FSDP2's ``fully_shard`` modules. The audit's scale rules read only this and the ops.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

MIB = 2**20


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


def _ddp_of(model: torch.nn.Module) -> Any:
    return next((m for m in model.modules() if isinstance(m, DistributedDataParallel)), None)


def _num_fsdp_modules(model: torch.nn.Module) -> int:
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # a torch built without distributed
        return 0
    return sum(isinstance(m, FSDPModule) for m in model.modules())


def _hook_name(ddp: Any) -> str | None:
    hooks = getattr(ddp, "_comm_hooks", None) or []
    if not hooks:
        return None
    hook = hooks[-1][0]
    return getattr(hook, "__qualname__", None) or getattr(hook, "__name__", None) or repr(hook)


# DDP's own runtime statistics (its logger; times in ns, from the iterations it samples)
DDP_LOGGING_KEYS = (
    "unused_parameter_size",
    "num_parameter_tensors",
    "total_parameter_size_bytes",
    "num_buckets_reduced",
    "bucket_sizes",
    "has_rebuilt_buckets",
    "iteration",
    "backward_compute_time",
    "backward_comm_time",
    "backward_compute_comm_overlap_time",
)


def _ddp_logging(ddp: Any) -> dict[str, Any] | None:
    try:
        data = ddp._get_ddp_logging_data()
    except Exception:  # noqa: BLE001 - a private DDP method: absent or changed in some torch
        return None
    return {k: data[k] for k in DDP_LOGGING_KEYS if k in data}


def _ddp_info(ddp: Any) -> dict[str, Any]:
    group = getattr(ddp, "process_group", None)
    return {
        "bucket_cap_mb": ddp.bucket_bytes_cap / MIB,
        "find_unused_parameters": bool(ddp.find_unused_parameters),
        "gradient_as_bucket_view": bool(ddp.gradient_as_bucket_view),
        "static_graph": bool(getattr(ddp, "static_graph", False)),
        "comm_hook": _hook_name(ddp),
        "world_size": group.size() if group is not None else None,
        "logging": _ddp_logging(ddp),
    }


def distributed_info(model: torch.nn.Module) -> dict[str, Any]:
    """World size, rank, backend and the model's data-parallel wrapping, as plain values."""
    world_size = _env_int("WORLD_SIZE", 1)
    rank = _env_int("RANK", 0)
    backend = None
    if dist.is_available() and dist.is_initialized():
        world_size, rank, backend = dist.get_world_size(), dist.get_rank(), str(dist.get_backend())
    ddp = _ddp_of(model)
    num_fsdp = _num_fsdp_modules(model)
    strategy = "ddp" if ddp is not None else ("fsdp2" if num_fsdp else None)
    if ddp is not None and getattr(ddp, "process_group", None) is not None:
        # the wrapper's own group is the data-parallel world, whatever the default group says
        world_size = max(world_size, ddp.process_group.size())
    return {
        "world_size": world_size,
        "rank": rank,
        "local_rank": _env_int("LOCAL_RANK", 0),
        "backend": backend,
        "strategy": strategy,
        "ddp": _ddp_info(ddp) if ddp is not None else None,
        "num_fsdp_modules": num_fsdp,
    }
