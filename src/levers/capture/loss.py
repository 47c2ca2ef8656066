"""Finding the loss in what a training step returned.

Steps return the loss in many shapes: the scalar tensor itself, ``(loss, logits)``, a dict with a
``"loss"`` key, or a model output with a ``.loss`` attribute (Hugging Face's ``ModelOutput`` is
both a dict and has the attribute). :func:`find_loss` reads all of them the same way, so that the
NaN/inf kill line of ``levers ab``, its parity gate and the audit's NaN warning see one loss.
"""

from __future__ import annotations

from collections.abc import Mapping
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
