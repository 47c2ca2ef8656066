"""Where a comparison ran: versions, hardware and the commits of the code involved."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

import levers
from levers.capture.env import cpu_name


def _run(args: list[str], cwd: str | None = None) -> str | None:
    try:
        done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


COMMIT_ENV = "LEVERS_GIT_COMMIT"


def git_commit(cwd: str | Path) -> dict[str, Any] | None:
    """The commit checked out at ``cwd`` and whether the tree has uncommitted changes."""
    commit = _run(["git", "rev-parse", "HEAD"], cwd=str(cwd))
    if commit is None:
        return None
    status = _run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=str(cwd))
    return {"commit": commit, "dirty": bool(status)}


def _gpu(device: torch.device) -> dict[str, Any] | None:
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(device)
    driver = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    return {
        "name": props.name,
        "capability": f"{props.major}.{props.minor}",
        "total_memory_bytes": props.total_memory,
        "driver": driver.splitlines()[0] if driver else None,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
    }


def _declared_commit() -> dict[str, Any] | None:
    # a copy of the source without .git (a benchmark machine) can say which commit it is
    commit = os.environ.get(COMMIT_ENV)
    return {"commit": commit, "dirty": None, "declared_by": COMMIT_ENV} if commit else None


def _load_average() -> list[float] | None:
    # other processes on the machine are the first suspect for a wide CI on a CPU
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except (OSError, AttributeError):
        return None


def environment(device: str | torch.device, cwd: str | Path = ".") -> dict[str, Any]:
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": torch.__version__,
        "levers": levers.__version__,
        "levers_commit": git_commit(Path(levers.__file__).parent) or _declared_commit(),
        "commit": git_commit(cwd),
        "cpu": cpu_name(),
        "num_threads": torch.get_num_threads(),
        "num_cpus": os.cpu_count(),
        "load_average_1_5_15m": _load_average(),  # read when the run ended
        "device": str(device),
        "gpu": _gpu(torch.device(device)),
    }
