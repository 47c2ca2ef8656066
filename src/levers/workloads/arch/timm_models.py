"""The ``arch`` workload's timm architectures: ``model=timm:<name>``, any name of
``timm.list_models()``, built by ``timm.create_model(name, pretrained=False)`` with random
weights.

``full`` is the model as registered at its pretrained config's input size, batch 64. ``tiny``
shrinks it where timm lets a caller: a model class that takes an int ``depth`` or ``num_blocks``
(ViT, DeiT, MLP-Mixer...) gets ``layers`` blocks (2), one that takes ``img_size`` gets 64 x 64
images, and any other is fed 64 x 64 images unless its pretrained config says its input size is
fixed, or a forward on the meta device refuses 64 x 64 and takes its registered size (then its
own). Stage-wise nets keep their registered depth: timm's entrypoints spell
stages in as many ways as there are families, and the smallest variant of a family is the tiny
one (``bench/arch_sweep.py`` samples that one per timm module). The step is cross-entropy over
the logits.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
import torch.nn.functional as F

from levers.optional import import_timm
from levers.workloads.zoo.spec import Shape, ZooModel, images

PREFIX = "timm:"
TINY_IMAGE_SIZE = 64
TINY_DEPTH = 2
# how a timm model class spells the number of its (one stack of) blocks
DEPTH_PARAMETERS = ("depth", "num_blocks")


def _init_parameters(model_class: type) -> dict[str, inspect.Parameter]:
    try:
        return dict(inspect.signature(model_class.__init__).parameters)
    except (TypeError, ValueError):
        return {}


def _on_meta(name: str, **kwargs: Any) -> torch.nn.Module | None:
    """The model built on the meta device (its class and shapes, no memory, no init), or None
    for a model whose constructor reads values (then it is built as registered)."""
    try:
        with torch.device("meta"):
            return import_timm().create_model(name, pretrained=False, **kwargs)
    except Exception:  # noqa: BLE001 - any constructor that cannot run on meta tensors
        return None


def _runs_on_meta(name: str, kwargs: dict[str, Any], image: tuple[int, ...]) -> bool:
    model = _on_meta(name, **kwargs)
    if model is None:
        return False
    try:
        with torch.no_grad():
            model(torch.empty(1, *image, device="meta"))
    except Exception:  # noqa: BLE001 - a shape the model refuses, or an op meta tensors lack
        return False
    return True


def _runs_smaller(name: str, kwargs: dict[str, Any], input_size: tuple[int, ...],
                  depth: dict[str, int]) -> bool:
    """Whether the model takes ``TINY_IMAGE_SIZE`` images: False only where a forward on the
    meta device refuses them and runs at the registered input size (a window or block size
    that must divide the feature map: timm's halonet at 64 x 64), so that a model the meta
    device cannot run keeps the smaller images."""
    tiny = (input_size[0], TINY_IMAGE_SIZE, TINY_IMAGE_SIZE)
    if _runs_on_meta(name, {**kwargs, **depth}, tiny):
        return True
    registered = {k: v for k, v in kwargs.items() if k != "img_size"}
    return not _runs_on_meta(name, {**registered, **depth}, input_size)


def shrink_kwargs(name: str, size: str, layers: int | None) -> tuple[dict[str, Any], Shape]:
    """The kwargs ``create_model`` gets at ``size`` and the shape fields they imply."""
    timm = import_timm()
    cfg = timm.models.get_pretrained_cfg(name)
    input_size = tuple(cfg.input_size if cfg is not None else (3, 224, 224))
    fixed = bool(cfg is not None and cfg.fixed_input_size)
    meta = _on_meta(name)
    parameters = {} if meta is None else _init_parameters(type(meta))
    depth_name = next(
        (n for n in DEPTH_PARAMETERS
         if n in parameters and isinstance(parameters[n].default, int)),
        None,
    )
    # the class takes it, but the registered function may pass it itself (timm's
    # gmlp_ti16_224: num_blocks=30 in its own dict, which a second num_blocks makes a TypeError);
    # built once more on meta to find out, only where a depth would be passed
    fixed_depth = (depth_name is not None and (size == "tiny" or layers is not None)
                   and _on_meta(name, **{depth_name: TINY_DEPTH}) is None)
    takes_depth = depth_name is not None and not fixed_depth
    kwargs: dict[str, Any] = {}
    shape: Shape = {"channels": input_size[0], "image_size": tuple(input_size[1:]),
                    "layers": None}
    if size == "tiny":
        if "img_size" in parameters:
            kwargs["img_size"] = TINY_IMAGE_SIZE
        if ("img_size" in parameters or not fixed) and _runs_smaller(
            name, kwargs, input_size, {depth_name: TINY_DEPTH} if takes_depth else {}
        ):
            shape["image_size"] = (TINY_IMAGE_SIZE, TINY_IMAGE_SIZE)
        else:
            kwargs.pop("img_size", None)
        if takes_depth:
            shape["layers"] = TINY_DEPTH
    if layers is not None:
        if fixed_depth:
            raise ValueError(
                f"timm's {name} sets its own {depth_name} (its registered function passes it), "
                "so layers= cannot change it; leave layers unset (its registered depth) or pick "
                "a smaller variant"
            )
        if not takes_depth:
            raise ValueError(
                f"timm's {name} takes no int depth (or num_blocks) argument, so layers= cannot "
                "change it; leave layers unset (its registered depth) or pick a smaller variant"
            )
        shape["layers"] = layers
    if shape["layers"] is not None:
        kwargs[depth_name] = shape["layers"]
    return kwargs, shape


def _tokens(shape: Shape) -> int:
    patches = shape.get("patch_tokens")
    return shape["batch_size"] * patches if patches else shape["batch_size"]  # else images


def _logits_loss(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    return F.cross_entropy(model(inputs["pixel_values"]), inputs["labels"])


def entry(name: str, layers: int | None = None) -> ZooModel:
    """The zoo entry of ``timm:<name>``; ``layers`` here (not in the shape) because it decides
    what is passed to ``create_model``."""
    timm = import_timm()
    if name not in timm.list_models():
        raise ValueError(
            f"model={PREFIX + name!r} is not in timm's registry (timm {timm.__version__}); "
            "timm.list_models('pattern*') lists the names"
        )
    sizes = {}
    for size in ("tiny", "full"):
        kwargs, shape = shrink_kwargs(name, size, layers)
        meta = _on_meta(name, num_classes=10, **kwargs)
        patch_embed = getattr(meta, "patch_embed", None)
        patches = getattr(patch_embed, "num_patches", None)
        prefix = getattr(meta, "num_prefix_tokens", 0)
        sizes[size] = {
            **shape,
            "kwargs": kwargs,
            "num_labels": 10 if size == "tiny" else 1000,
            "batch_size": 2 if size == "tiny" else 64,
            "patch_tokens": patches + prefix if isinstance(patches, int) else None,
        }
    modules = [] if meta is None else meta.modules()
    attention = any("Attention" in type(m).__name__ for m in modules)

    def make(shape: Shape) -> torch.nn.Module:
        return timm.create_model(
            name, pretrained=False, num_classes=shape["num_labels"], **shape["kwargs"]
        )

    return ZooModel(
        name=f"{PREFIX}{name}",
        family="vision-transformer" if attention else "convnet",
        library="timm",
        sizes=sizes,
        make_model=make,
        make_batch=images,
        loss=_logits_loss,
        tokens_per_step=_tokens,
    )
