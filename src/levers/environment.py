"""Where a step or a comparison ran: one record (:class:`Environment`) for a capture, an A/B's
result and a tune record, and the one reader of a git commit.

A copy of levers whose ``.git`` is not the commit it holds (a benchmark machine that receives the
working tree without its history) names its commit in ``LEVERS_COMMIT``; the older spelling
``LEVERS_GIT_COMMIT`` is still read.
"""

from __future__ import annotations

import functools
import os
import platform
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

import torch

import levers

COMMIT_ENV = "LEVERS_COMMIT"
# read when COMMIT_ENV is unset: `levers ab` read this spelling before the two were one
COMMIT_ENV_ALIASES = ("LEVERS_GIT_COMMIT",)


@dataclass(frozen=True)
class Commit:
    """A commit and whether the tree had uncommitted changes (None: not known, as for a commit
    declared in ``LEVERS_COMMIT``)."""

    commit: str
    dirty: bool | None
    declared_by: str | None = None  # the environment variable that named it, if one did

    def to_dict(self) -> dict[str, Any]:
        return {"commit": self.commit, "dirty": self.dirty, "declared_by": self.declared_by}


class GpuInfo(TypedDict):
    name: str
    capability: str
    total_memory_bytes: int
    driver: str | None
    cuda: str | None
    cudnn: int | None


class Environment(TypedDict):
    """The environment record (a plain dict, so that it is JSON as it stands).

    ``levers_commit`` is the commit of levers itself (a checkout's, or the declared one);
    ``workdir_commit`` the commit of the directory the command ran in, when the caller asked for
    it (an A/B's result: the user's code is there). ``device_name`` is the GPU's name, or the CPU
    model on a CPU; ``gpu`` is null on a CPU.
    """

    levers: str
    levers_commit: str | None
    levers_commit_dirty: bool | None
    workdir_commit: dict[str, Any] | None
    torch: str
    python: str
    platform: str
    device: str
    device_name: str
    cpu: str
    num_cpus: int | None
    num_threads: int
    load_average_1_5_15m: list[float] | None
    gpu: GpuInfo | None


def _run(args: list[str], cwd: str | None = None) -> str | None:
    try:
        done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def read_commit(cwd: str | Path) -> Commit | None:
    """The commit checked out at ``cwd`` and whether the tree has uncommitted changes; None
    outside a git checkout (or without git)."""
    commit = _run(["git", "rev-parse", "HEAD"], cwd=str(cwd))
    if not commit:
        return None
    status = _run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=str(cwd))
    return Commit(commit, bool(status))


def declared_commit(environ: Any = None) -> Commit | None:
    """The commit named in ``LEVERS_COMMIT`` (or its older spelling), or None."""
    environ = os.environ if environ is None else environ
    for name in (COMMIT_ENV, *COMMIT_ENV_ALIASES):
        value = environ.get(name, "").strip()
        if value:
            return Commit(value, None, declared_by=name)
    return None


@functools.lru_cache(maxsize=1)
def levers_commit() -> Commit | None:
    """The commit of levers itself: the declared one first (the copy's ``.git``, if any, may
    not be it), else the checkout's levers runs from."""
    return declared_commit() or read_commit(Path(levers.__file__).parent)


def levers_commit_id() -> str | None:
    """:func:`levers_commit`'s commit alone, shortened to 12 characters (a benchmark row's)."""
    commit = levers_commit()
    return commit.commit[:12] if commit is not None else None


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


def _gpu(device: torch.device) -> GpuInfo | None:
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


def _load_average() -> list[float] | None:
    # other processes on the machine are the first suspect for a wide CI on a CPU
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except (OSError, AttributeError):
        return None


def environment(device: str | torch.device, *, cwd: str | Path | None = None) -> Environment:
    """Where this process runs, read now; ``cwd``: also the commit of that directory."""
    device = torch.device(device)
    commit = levers_commit()
    gpu = _gpu(device)
    return {
        "levers": levers.__version__,
        "levers_commit": commit.commit if commit is not None else None,
        "levers_commit_dirty": commit.dirty if commit is not None else None,
        "workdir_commit": _commit_dict(read_commit(cwd)) if cwd is not None else None,
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "device": str(device),
        "device_name": gpu["name"] if gpu is not None else cpu_name(),
        "cpu": cpu_name(),
        "num_cpus": os.cpu_count(),
        "num_threads": torch.get_num_threads(),
        "load_average_1_5_15m": _load_average(),  # read when the record is made
        "gpu": gpu,
    }


def _commit_dict(commit: Commit | None) -> dict[str, Any] | None:
    return commit.to_dict() if commit is not None else None
