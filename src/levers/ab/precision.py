"""The precision a step really computes in, seen from inside the step.

Parameters may be float32 while the forward runs under bf16 autocast (the usual mixed-precision
recipe), so neither the ``dtype`` parameter nor the weights tell the whole story. A forward
pre-hook on the model (and, for a step that calls only its parts, on every module) reads the
autocast state while the step runs; only the first firing does any work.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Iterator

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


def _compiled(module: torch.nn.Module) -> bool:
    """Whether ``module`` runs as a compiled program: ``module.compile()`` (what the compile
    levers call) or ``torch.compile(module)``'s wrapper."""
    return getattr(module, "_compiled_call_impl", None) is not None or hasattr(module, "_orig_mod")


def _eager_modules(model: torch.nn.Module) -> Iterator[tuple[torch.nn.Module, bool]]:
    """(module, compiled) for ``model`` and each module whose forward is called from eager code:
    a compiled module's descendants run inside its program and are left out."""
    todo = [model]
    while todo:
        module = todo.pop()
        compiled = _compiled(module)
        yield module, compiled
        if not compiled:
            todo.extend(reversed(list(module.children())))


@contextmanager
def autocast_probe(
    model: torch.nn.Module, device_type: str
) -> Iterator[Callable[[], torch.dtype | None]]:
    """Yield ``seen()``: the autocast dtype when ``model``'s forward first ran, None if it was off.

    The model's own forward decides. A submodule's first forward counts only when the model's
    never ran (a step that calls its parts directly): a submodule may be shared with another
    model (transformers' XLM calls one module-level GELU from every XLM model), and its hook then
    fires in that model's step too, under that step's autocast.

    The probe stays outside compiled code: a hook that dynamo traces is guarded on, so removing
    it would make every compiled program compile again for the timed steps (30 s of a llama's
    A/B on the H200). A module compiled with ``module.compile()`` is read where its compiled
    program is called (its ``_compiled_call_impl``, wrapped while the probe is on, so the
    program itself is untouched); its descendants are not hooked.
    """
    own: list[torch.dtype | None] = []
    parts: list[torch.dtype | None] = []

    def read(seen: list[torch.dtype | None]) -> None:
        if not seen:
            seen.append(autocast_dtype(device_type))

    undo: list[Callable[[], None]] = []
    for module, compiled in _eager_modules(model):
        seen = own if module is model else parts
        program = getattr(module, "_compiled_call_impl", None)
        if compiled and program is not None:
            def call(*args: Any, _program: Any = program, _seen: Any = seen, **kwargs: Any) -> Any:
                read(_seen)
                return _program(*args, **kwargs)

            module._compiled_call_impl = call
            undo.append(lambda m=module, p=program: setattr(m, "_compiled_call_impl", p))
        else:
            handle = module.register_forward_pre_hook(lambda m, a, _seen=seen: read(_seen))
            undo.append(handle.remove)
    try:
        yield lambda: own[0] if own else parts[0] if parts else None
    finally:
        for step in undo:
            step()
