"""What a zoo entry declares: how to build its model and its batches at each size."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

SIZES = ("tiny", "full")
# an encoder masked LM's [MASK] share of tokens, as in bert's pre-training
MASKED_FRACTION = 0.15
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
        shape.get("ids_below") or shape["vocab_size"],  # below a model's multimodal token ids
        (shape["batch_size"], shape[length_key]),
        generator=generator,
        device=generator.device,
    )


def causal_lm_batch(shape: Shape, generator: torch.Generator) -> dict[str, torch.Tensor]:
    ids_bt = token_ids(shape, generator)
    return {"input_ids": ids_bt, "labels": ids_bt}  # the model shifts the labels


def masked_lm_batch(shape: Shape, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Token ids with :data:`MASKED_FRACTION` of them as targets (labels -100 elsewhere)."""
    ids_bt = token_ids(shape, generator)
    masked_bt = (
        torch.rand(ids_bt.shape, generator=generator, device=generator.device) < MASKED_FRACTION
    )
    masked_bt[:, 0] = True  # at least one target per row
    labels_bt = torch.where(masked_bt, ids_bt, torch.full_like(ids_bt, -100))
    return {"input_ids": ids_bt, "labels": labels_bt}


def images(shape: Shape, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Random images (N, C, H, W) in the parameter dtype and class labels; ``image_size`` is a
    side or (height, width), ``channels`` 3 unless the shape says otherwise."""
    size = shape["image_size"]
    height, width = size if isinstance(size, (tuple, list)) else (size, size)
    pixels = torch.randn(
        (shape["batch_size"], shape.get("channels", 3), height, width),
        generator=generator,
        device=generator.device,
    )
    labels = torch.randint(
        0, shape["num_labels"], (shape["batch_size"],), generator=generator,
        device=generator.device,
    )
    return {"pixel_values": pixels.to(shape["param_dtype"]), "labels": labels}


def hf_loss(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """The loss a transformers model returns when given its labels."""
    return model(**inputs).loss
