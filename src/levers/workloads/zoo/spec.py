"""What a zoo entry declares: how to build its model and its batches at each size."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

SIZES = ("tiny", "full")
FAMILIES = ("decoder", "moe", "encoder", "encoder-decoder", "vision-transformer", "convnet")

Shape = dict[str, Any]  # a size's fields: batch_size, layers and the model's own


@dataclass(frozen=True)
class ZooModel:
    name: str  # "gpt2"
    family: str  # one of FAMILIES
    library: str  # "transformers", "timm" or "levers" (hand-written here)
    sizes: dict[str, Shape]  # "tiny" and "full"
    make_model: Callable[[Shape], torch.nn.Module]  # built under the device and dtype
    make_batch: Callable[[Shape, torch.Generator], dict[str, torch.Tensor]]
    loss: Callable[[torch.nn.Module, dict[str, torch.Tensor]], torch.Tensor]
    tokens_per_step: Callable[[Shape], int]

    def __post_init__(self) -> None:
        assert self.family in FAMILIES, self.family
        assert set(self.sizes) == set(SIZES), self.name

    def available(self) -> str | None:
        """None when the model's library is installed, else what to install."""
        if self.library == "levers" or importlib.util.find_spec(self.library) is not None:
            return None
        return (
            f"the zoo model {self.name!r} needs {self.library}, which is not installed; "
            f"install it with: pip install {self.library}"
        )


def token_ids(shape: Shape, generator: torch.Generator, length_key: str = "seq_len") -> torch.Tensor:
    return torch.randint(
        0,
        shape["vocab_size"],
        (shape["batch_size"], shape[length_key]),
        generator=generator,
        device=generator.device,
    )


def images(shape: Shape, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Random images (N, 3, H, W) in the parameter dtype and class labels."""
    size = shape["image_size"]
    pixels = torch.randn(
        (shape["batch_size"], 3, size, size), generator=generator, device=generator.device
    )
    labels = torch.randint(
        0, shape["num_labels"], (shape["batch_size"],), generator=generator,
        device=generator.device,
    )
    return {"pixel_values": pixels.to(shape["param_dtype"]), "labels": labels}


def hf_loss(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """The loss a transformers model returns when given its labels."""
    return model(**inputs).loss
