"""Checking and resolving the parameters of the built-in workload factories.

Every factory accepts the same core parameters (``size``, ``device``, ``dtype``, ``seed``,
``batch_size``); these helpers turn what a user typed (often a string from the command line)
into a validated value, or raise ``ValueError`` with a message that lists what is allowed.
"""

from __future__ import annotations

from typing import Any

import torch

# Accepted spellings of each parameter dtype; the first spelling is the canonical name.
_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def choice(name: str, value: Any, allowed: tuple[str, ...]) -> str:
    """Return ``value`` if it is one of ``allowed``, else raise a ValueError that lists them."""
    if value not in allowed:
        raise ValueError(f"{name}={value!r} is not supported; use one of: {', '.join(allowed)}")
    return value


def positive_int(name: str, value: Any) -> int:
    """Return ``value`` as an int > 0; decimal strings (from a command line) are accepted."""
    number = integer(name, value)
    if number <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return number


def integer(name: str, value: Any) -> int:
    """Return ``value`` as an int; decimal strings (from a command line) are accepted."""
    if isinstance(value, bool):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    raise ValueError(f"{name} must be an integer, got {value!r}")


def dtype(value: Any) -> torch.dtype:
    """Resolve a parameter dtype given as a ``torch.dtype`` or a name like ``"bfloat16"``."""
    if isinstance(value, torch.dtype) and value in _DTYPES.values():
        return value
    if isinstance(value, str) and value.removeprefix("torch.") in _DTYPES:
        return _DTYPES[value.removeprefix("torch.")]
    raise ValueError(f"dtype={value!r} is not supported; use one of: {', '.join(_DTYPES)}")


def dtype_name(value: torch.dtype) -> str:
    """The canonical name of a supported dtype, as recorded in a workload's params."""
    return next(name for name, candidate in _DTYPES.items() if candidate == value)


def device(value: Any) -> torch.device:
    """Resolve ``"cpu"`` or ``"cuda"`` (``"cuda:N"`` too); CUDA must be available.

    Under a fake-tensor mode no memory is allocated, so a CUDA device is accepted on a machine
    without one (that is how a large workload is sized on a CPU).
    """
    try:
        resolved = torch.device(value)
    except (RuntimeError, TypeError):
        raise ValueError(f"device={value!r} is not supported; use one of: cpu, cuda") from None
    if resolved.type not in ("cpu", "cuda"):
        raise ValueError(f"device={value!r} is not supported; use one of: cpu, cuda")
    if resolved.type == "cuda" and not torch.cuda.is_available() and not _fake_mode_active():
        raise ValueError(
            f"device={value!r} was asked for but CUDA is not available here; use device=cpu "
            "(with size=tiny) or run on a machine with a GPU"
        )
    return resolved


def _fake_mode_active() -> bool:
    # detect_fake_mode is the supported way to ask; it lives in a private module, so a torch
    # that moved it just loses the CUDA-without-a-GPU convenience.
    try:
        from torch._guards import detect_fake_mode
    except ImportError:
        return False
    return detect_fake_mode() is not None
