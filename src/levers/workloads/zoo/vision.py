"""The zoo's vision models: transformers' ViT and Swin, timm's ViT-B/16 (where timm is
installed), transformers' ResNet and ConvNeXt, each from its default config with the shapes set.
The step classifies random images into ``num_labels`` classes with the model's own loss (timm's
model returns logits: cross-entropy over them)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from levers.optional import import_timm, import_transformers
from levers.workloads.zoo.spec import Shape, ZooModel, hf_loss, images


def _transformers() -> Any:
    return import_transformers()


def _vit_model(shape: Shape) -> torch.nn.Module:
    transformers = _transformers()
    config = transformers.ViTConfig(
        image_size=shape["image_size"],
        patch_size=shape["patch_size"],
        hidden_size=shape["width"],
        num_hidden_layers=shape["layers"],
        num_attention_heads=shape["heads"],
        intermediate_size=shape["ffn"],
        num_labels=shape["num_labels"],
    )
    return transformers.ViTForImageClassification(config)


def _patch_tokens(shape: Shape) -> int:
    """Patch tokens entering the first block (ViT: with its class token)."""
    side = shape["image_size"] // shape["patch_size"]
    return shape["batch_size"] * (side * side + shape.get("class_tokens", 0))


_VIT_TINY = {"image_size": 32, "patch_size": 8, "width": 64, "layers": 2, "heads": 4, "ffn": 128,
             "num_labels": 10, "batch_size": 2, "class_tokens": 1}
# ViT-B/16 at 224 x 224, batch 64
_VIT_B16 = {"image_size": 224, "patch_size": 16, "width": 768, "layers": 12, "heads": 12,
            "ffn": 3072, "num_labels": 1000, "batch_size": 64, "class_tokens": 1}

VIT = ZooModel(
    name="vit",
    family="vision-transformer",
    library="transformers",
    sizes={"tiny": _VIT_TINY, "full": _VIT_B16},
    make_model=_vit_model,
    make_batch=images,
    loss=hf_loss,
    tokens_per_step=_patch_tokens,
)


def _stages(shape: Shape, key: str) -> list[int]:
    # "layers" is the depth of every stage but the deepest, which keeps its share (Swin-T and
    # ConvNeXt-T: 2, 2, 6, 2 and 3, 3, 9, 3); depth=layers gives the shipped model's stage ratio
    depths = list(shape[key])
    return [shape["layers"] * d // min(depths) for d in depths]


def _swin_model(shape: Shape) -> torch.nn.Module:
    transformers = _transformers()
    config = transformers.SwinConfig(
        image_size=shape["image_size"],
        patch_size=shape["patch_size"],
        window_size=shape["window_size"],
        embed_dim=shape["width"],
        depths=_stages(shape, "depths"),
        num_heads=list(shape["heads"]),
        num_labels=shape["num_labels"],
    )
    return transformers.SwinForImageClassification(config)


SWIN = ZooModel(
    name="swin",
    family="vision-transformer",
    library="transformers",
    sizes={
        "tiny": {"image_size": 32, "patch_size": 2, "window_size": 4, "width": 16,
                 "depths": (1, 1), "heads": (2, 4), "layers": 1, "num_labels": 10,
                 "batch_size": 2},
        # Swin-T at 224 x 224, batch 64
        "full": {"image_size": 224, "patch_size": 4, "window_size": 7, "width": 96,
                 "depths": (2, 2, 6, 2), "heads": (3, 6, 12, 24), "layers": 2,
                 "num_labels": 1000, "batch_size": 64},
    },
    make_model=_swin_model,
    make_batch=images,
    loss=hf_loss,
    tokens_per_step=_patch_tokens,
)


def _timm_vit_model(shape: Shape) -> torch.nn.Module:
    return import_timm().create_model(
        "vit_base_patch16_224",
        pretrained=False,
        img_size=shape["image_size"],
        patch_size=shape["patch_size"],
        embed_dim=shape["width"],
        depth=shape["layers"],
        num_heads=shape["heads"],
        mlp_ratio=shape["ffn"] / shape["width"],
        num_classes=shape["num_labels"],
    )


def _logits_loss(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    return F.cross_entropy(model(inputs["pixel_values"]), inputs["labels"])


TIMM_VIT = ZooModel(
    name="timm-vit",
    family="vision-transformer",
    library="timm",
    sizes={"tiny": _VIT_TINY, "full": _VIT_B16},
    make_model=_timm_vit_model,
    make_batch=images,
    loss=_logits_loss,
    tokens_per_step=_patch_tokens,
)


def _resnet_model(shape: Shape) -> torch.nn.Module:
    transformers = _transformers()
    config = transformers.ResNetConfig(
        embedding_size=shape["width"],
        hidden_sizes=list(shape["hidden_sizes"]),
        depths=_stages(shape, "depths"),
        num_labels=shape["num_labels"],
    )
    return transformers.ResNetForImageClassification(config)


RESNET = ZooModel(
    name="resnet",
    family="convnet",
    library="transformers",
    sizes={
        "tiny": {"image_size": 32, "width": 8, "hidden_sizes": (16, 32), "depths": (1, 1),
                 "layers": 1, "num_labels": 10, "batch_size": 2},
        # ResNet-50 at 224 x 224, batch 128
        "full": {"image_size": 224, "width": 64, "hidden_sizes": (256, 512, 1024, 2048),
                 "depths": (3, 4, 6, 3), "layers": 3, "num_labels": 1000, "batch_size": 128},
    },
    make_model=_resnet_model,
    make_batch=images,
    loss=hf_loss,
    tokens_per_step=lambda shape: shape["batch_size"],  # images
)


def _convnext_model(shape: Shape) -> torch.nn.Module:
    transformers = _transformers()
    config = transformers.ConvNextConfig(
        hidden_sizes=list(shape["hidden_sizes"]),
        depths=_stages(shape, "depths"),
        num_stages=len(shape["depths"]),
        image_size=shape["image_size"],
        num_labels=shape["num_labels"],
    )
    return transformers.ConvNextForImageClassification(config)


CONVNEXT = ZooModel(
    name="convnext",
    family="convnet",
    library="transformers",
    sizes={
        "tiny": {"image_size": 32, "hidden_sizes": (16, 32), "depths": (1, 1), "layers": 1,
                 "num_labels": 10, "batch_size": 2},
        # ConvNeXt-T at 224 x 224, batch 64
        "full": {"image_size": 224, "hidden_sizes": (96, 192, 384, 768), "depths": (3, 3, 9, 3),
                 "layers": 3, "num_labels": 1000, "batch_size": 64},
    },
    make_model=_convnext_model,
    make_batch=images,
    loss=hf_loss,
    tokens_per_step=lambda shape: shape["batch_size"],  # images
)

MODELS = (VIT, SWIN, TIMM_VIT, RESNET, CONVNEXT)
