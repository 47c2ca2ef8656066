"""The precision a step really computes in, seen from inside the step.

Parameters may be float32 while the forward runs under bf16 autocast (the usual mixed-precision
recipe), so neither the ``dtype`` parameter nor the weights tell the whole story. A forward
pre-hook on the model (and, for a step that calls only its parts, on every module) reads the
autocast state while the step runs; only the first firing does any work.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

import torch

LOW_PRECISION = (torch.bfloat16, torch.float16)


def autocast_dtype(device_type: str) -> torch.dtype | None:
    """The autocast dtype active now for ``device_type``, or None when autocast is off."""
    try:
        if not torch.is_autocast_enabled(device_type):
            return None
        return torch.get_autocast_dtype(device_type)
    except TypeError:  # torch < 2.4 takes no device type here
        if device_type == "cuda":
            return torch.get_autocast_gpu_dtype() if torch.is_autocast_enabled() else None
        return torch.get_autocast_cpu_dtype() if torch.is_autocast_cpu_enabled() else None


@contextmanager
def autocast_probe(
    model: torch.nn.Module, device_type: str
) -> Iterator[Callable[[], torch.dtype | None]]:
    """Yield ``seen()``: the autocast dtype when ``model``'s forward first ran, None if it was off.

    The model's own forward decides. A submodule's first forward counts only when the model's
    never ran (a step that calls its parts directly): a submodule may be shared with another
    model (transformers' XLM calls one module-level GELU from every XLM model), and its hook then
    fires in that model's step too, under that step's autocast.
    """
    own: list[torch.dtype | None] = []
    parts: list[torch.dtype | None] = []

    def hook_of(seen: list[torch.dtype | None]) -> Callable[[torch.nn.Module, object], None]:
        def hook(module: torch.nn.Module, args: object) -> None:
            if not seen:
                seen.append(autocast_dtype(device_type))

        return hook

    handles = [model.register_forward_pre_hook(hook_of(own))]
    handles += [
        m.register_forward_pre_hook(hook_of(parts)) for m in model.modules() if m is not model
    ]
    try:
        yield lambda: own[0] if own else parts[0] if parts else None
    finally:
        for handle in handles:
            handle.remove()
