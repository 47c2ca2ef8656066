"""The environment and settings a capture ran under: versions, hardware, global flags."""

from __future__ import annotations

import functools
import os
import platform
import subprocess
import sys
from typing import Any

import torch

import levers
from levers.capture.distributed import distributed_info


@functools.lru_cache(maxsize=1)
def git_commit() -> str | None:
    """The commit of the levers checkout, when levers runs from one.

    ``LEVERS_COMMIT`` names it instead, for a copy of a tree whose ``.git`` is not that commit
    (a benchmark machine that receives the working tree without its history).
    """
    declared = os.environ.get("LEVERS_COMMIT", "").strip()
    if declared:
        return declared[:12]
    here = os.path.dirname(os.path.abspath(levers.__file__))
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"],
            cwd=here, capture_output=True, text=True, timeout=5, check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


@functools.lru_cache(maxsize=1)
def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment(device: torch.device) -> dict[str, Any]:
    env: dict[str, Any] = {
        "levers": levers.__version__,
        "levers_commit": git_commit(),
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "device": str(device),
        "num_cpus": os.cpu_count(),
        "cpu": cpu_name(),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env["device_name"] = props.name
        env["device_memory_bytes"] = props.total_memory
        env["cuda"] = torch.version.cuda
        env["capability"] = f"{props.major}.{props.minor}"
    else:
        env["device_name"] = env["cpu"]
    return env


def _optimizer_info(optimizer: torch.optim.Optimizer | None) -> dict[str, Any] | None:
    if optimizer is None:
        return None
    plain = (bool, int, float, str, type(None))
    defaults = {k: v for k, v in optimizer.defaults.items() if isinstance(v, plain)}
    return {
        "class": type(optimizer).__name__,
        "defaults": defaults,
        "num_params": sum(len(g["params"]) for g in optimizer.param_groups),
        # what ZeRO-1/FSDP would shard across ranks
        "state_bytes": sum(
            v.numel() * v.element_size()
            for state in optimizer.state.values()
            for v in state.values()
            if isinstance(v, torch.Tensor)
        ),
    }


def settings(workload: Any, recorder: Any) -> dict[str, Any]:
    """Global settings that decide which kernels run; read after the step."""
    return {
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "cuda_matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "cuda_alloc_conf": os.environ.get(
            "PYTORCH_CUDA_ALLOC_CONF", os.environ.get("PYTORCH_ALLOC_CONF")
        ),
        "autocast": sorted(recorder.autocast_seen),
        "activation_checkpointing": recorder.num_recomputed > 0,
        "optimizer": _optimizer_info(workload.optimizer),
        "distributed": distributed_info(workload.model),
    }
