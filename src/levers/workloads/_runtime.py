"""Pieces every built-in training step shares: seeding, autocast and the optimizer."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def seeded(seed: int, device: torch.device) -> Iterator[None]:
    """Seed the global RNGs for model initialisation, leaving the caller's RNG state untouched."""
    cuda_devices = []
    if device.type == "cuda" and torch.cuda.is_available():
        cuda_devices = [device.index if device.index is not None else torch.cuda.current_device()]
    with torch.random.fork_rng(devices=cuda_devices):
        torch.manual_seed(seed)
        yield


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Create parameters directly in ``dtype``.

    Casting a built model with ``.to(dtype)`` would hold two copies for a moment, and it fails
    on the parameters of a fake-tensor model.
    """
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def data_generator(seed: int, device: torch.device) -> torch.Generator:
    """The generator that the synthetic batches are drawn from, on the workload's device."""
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    return generator


def autocast(device: torch.device) -> contextlib.AbstractContextManager:
    """bf16 autocast on a GPU (the usual mixed-precision recipe); full precision on a CPU."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def adamw(model: torch.nn.Module, lr: float) -> torch.optim.AdamW:
    """AdamW fused into one kernel per parameter group.

    The fused kernel also reads its step count as a tensor; the unfused ones call ``.item()`` on
    it for every parameter, which a capture would report as host reads.
    """
    return torch.optim.AdamW(model.parameters(), lr=lr, fused=True)
