"""The total gradient norm of a step, taken from inside ``Workload.step()``.

``step()`` runs forward, backward, the optimizer step and ``zero_grad`` in one call, so the
gradients are gone by the time it returns. A post-accumulate-grad hook on every parameter sees
each gradient once it is final for that backward (the last firing wins, so gradient accumulation
over several backwards is handled) and keeps its norm as a device tensor: no host sync inside the
step. The caller reads the total after the step, where syncing is allowed.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

import torch


@contextmanager
def grad_norm_probe(model: torch.nn.Module) -> Iterator[Callable[[], torch.Tensor | None]]:
    """Yield ``take()``, which returns the total L2 grad norm of the last step and resets.

    ``take()`` returns None when no parameter received a gradient.
    """
    norms: dict[int, torch.Tensor] = {}

    def hook(param: torch.Tensor) -> None:
        if param.grad is None:  # a compiled backward's undefined gradient: eager has none either
            return
        # float32 accumulation at least: a bf16 norm over millions of elements loses the digits
        # we compare (and the float64 reference keeps its own precision)
        grad = param.grad.detach()
        dtype = torch.float64 if grad.dtype == torch.float64 else torch.float32
        norms[id(param)] = torch.linalg.vector_norm(grad, dtype=dtype)

    handles = [
        p.register_post_accumulate_grad_hook(hook) for p in model.parameters() if p.requires_grad
    ]

    def take() -> torch.Tensor | None:
        if not norms:
            return None
        values = list(norms.values())
        norms.clear()
        device = values[0].device
        return torch.linalg.vector_norm(torch.stack([v.to(device) for v in values]))

    try:
        yield take
    finally:
        for handle in handles:
            handle.remove()
