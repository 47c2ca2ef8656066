"""Per-side device memory while both sides live in one process.

Both workloads stay resident on the device for the whole comparison (the timed steps alternate
between them), so the allocator's own peak counts the other side's tensors too. A side's peak is
therefore assembled from two parts that are each its own:

- resident bytes: the storages its model parameters, buffers, gradients and optimizer state hold,
  counted by walking those tensors between steps (host-side metadata, no device sync);
- transient bytes: ``max_memory_allocated()`` in a window opened right before the side's step
  (``reset_peak_memory_stats()``) minus what was allocated when the window opened. Only this
  side's code runs inside the window, so every byte of that rise is its own.

Tensors a workload keeps outside those places (a batch captured in the step's closure, library
workspaces) are counted in neither part, on either side. Reserved bytes belong to the caching
allocator's single pool, shared by both sides; they are reported per window, not attributed.
On a CPU none of this is measured and every field is None.
"""

from __future__ import annotations

from itertools import chain
from typing import Iterable

import torch

from levers.capture.env import plain_tensors
from levers.workload import Workload


def _state_tensors(optimizer: torch.optim.Optimizer | None) -> Iterable[torch.Tensor]:
    if optimizer is None:
        return ()
    return (
        value
        for state in optimizer.state.values()
        for value in state.values()
        if isinstance(value, torch.Tensor)
    )


def storage_bytes(tensors: Iterable[torch.Tensor], device_type: str) -> int:
    """Bytes of the distinct storages on ``device_type`` behind ``tensors``, each counted once."""
    seen: set[int] = set()
    total_bytes = 0
    for tensor in chain.from_iterable(map(plain_tensors, tensors)):
        if tensor.device.type != device_type:
            continue
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        if key == 0 or key in seen:
            continue
        seen.add(key)
        total_bytes += storage.nbytes()
    return total_bytes


def resident_bytes(workload: Workload) -> int | None:
    """Bytes of device storage held by the workload's parameters, buffers, grads and state."""
    device = torch.device(workload.device)
    if device.type != "cuda":
        return None
    params = list(workload.model.parameters())
    grads = (p.grad for p in params if p.grad is not None)
    tensors = chain(params, workload.model.buffers(), grads, _state_tensors(workload.optimizer))
    return storage_bytes(tensors, "cuda")


def open_window(device: torch.device) -> int | None:
    """Start a memory window; returns the bytes allocated at its start (None off CUDA)."""
    if device.type != "cuda":
        return None
    torch.cuda.reset_peak_memory_stats(device)
    return torch.cuda.memory_allocated(device)


def close_window(device: torch.device) -> tuple[int, int] | tuple[None, None]:
    """(peak allocated, peak reserved) bytes of the process since the window opened."""
    if device.type != "cuda":
        return None, None
    return torch.cuda.max_memory_allocated(device), torch.cuda.max_memory_reserved(device)
