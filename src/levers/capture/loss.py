"""Finding the loss of a training step: in what the step returned, or in what a running script
passes to ``Tensor.backward``.

Steps return the loss in many shapes: the scalar tensor itself, ``(loss, logits)``, a dict with a
``"loss"`` key, or a model output with a ``.loss`` attribute (Hugging Face's ``ModelOutput`` is
both a dict and has the attribute). :func:`find_loss` reads all of them the same way, so that the
NaN/inf kill line of ``levers ab``, its parity gate and the audit's NaN warning see one loss.

A script (``levers audit -- python train.py``, ``levers tune -- ...``) runs its own step and
returns nothing to levers: :class:`LossTap` keeps the scalars it passes to ``Tensor.backward``
instead, and :func:`loss_of` reads them as the step's loss.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class FoundLoss:
    """The loss a step returned (a 0-d tensor, detached, or a float), or None with the reason."""

    value: torch.Tensor | float | None
    why_none: str = ""  # for the user, when value is None


def _scalar(value: Any) -> torch.Tensor | float | None:
    if isinstance(value, torch.Tensor) and value.numel() == 1 and value.dtype != torch.bool:
        return value.detach().reshape(())
    if isinstance(value, float) or (isinstance(value, int) and not isinstance(value, bool)):
        return float(value)
    return None


def find_loss(value: Any) -> FoundLoss:
    """The loss in a step's return value: itself when a scalar, else a ``loss`` key or
    attribute, else the first scalar tensor of a tuple or list."""
    if value is None:
        return FoundLoss(None, "step() returned None")
    scalar = _scalar(value)
    if scalar is not None:
        return FoundLoss(scalar)
    if isinstance(value, torch.Tensor):
        return FoundLoss(
            None, f"step() returned a tensor of shape {tuple(value.shape)}, not a scalar loss"
        )
    if isinstance(value, Mapping) and "loss" in value:
        inner = _scalar(value["loss"])
        if inner is not None:
            return FoundLoss(inner)
    attribute = getattr(value, "loss", None)
    if attribute is not None and not callable(attribute):
        inner = _scalar(attribute)
        if inner is not None:
            return FoundLoss(inner)
    if isinstance(value, (tuple, list)):
        for item in value:
            if isinstance(item, torch.Tensor):
                inner = _scalar(item)
                if inner is not None:
                    return FoundLoss(inner)
    return FoundLoss(
        None,
        f"step() returned a {type(value).__name__} with no scalar loss in it (return the loss "
        "tensor, a tuple starting with it, a dict with a 'loss' key or an object with .loss)",
    )


class LossTap:
    """Keeps each tensor passed to ``Tensor.backward`` while ``recording``; ``take()`` returns
    those of the step that just ended. ``Tensor.backward`` is put back on exit.

    ``copy``: keep a copy of each scalar (a CUDA graph's output, the loss, is overwritten by its
    next replay). Without it the tensor itself is kept and nothing runs on it inside the step: a
    captured step records every op, and the tap must add none.
    """

    def __init__(self, *, copy: bool = True) -> None:
        self.copy = copy
        self.recording = False
        self._seen: list[torch.Tensor] = []
        self._inside = 0  # calls of the wrapper under way
        self._original: Callable[..., Any] | None = None

    def __enter__(self) -> LossTap:
        original = self._original = torch.Tensor.backward
        tap = self

        @functools.wraps(original)
        def backward(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            # a torch function mode (the capture's) calls Tensor.backward, this wrapper, again
            # from inside the first call: the loss is kept once
            if tap.recording and not tap._inside:
                if not tap.copy:
                    tap._seen.append(tensor)
                elif tensor.numel() == 1:
                    tap._seen.append(tensor.detach().clone())
            tap._inside += 1
            try:
                return original(tensor, *args, **kwargs)
            finally:
                tap._inside -= 1

        torch.Tensor.backward = backward  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: Any) -> None:
        torch.Tensor.backward = self._original  # type: ignore[method-assign]

    def take(self) -> list[torch.Tensor]:
        seen, self._seen = self._seen, []
        return seen


def loss_of(seen: list[torch.Tensor]) -> float | None:
    """The loss of one step from what :class:`LossTap` kept: the sum of its scalars (gradient
    accumulation calls backward once per micro-batch), or None where it kept none."""
    scalars = [t for t in seen if t.numel() == 1]
    if not scalars:
        return None
    # sync point: read after the step (and outside a captured or timed step)
    return float(sum(float(t.detach().float()) for t in scalars))


def nonfinite(loss: float | None) -> bool:
    """Whether a loss was seen and is NaN or infinite."""
    return loss is not None and not math.isfinite(loss)
