"""``zoo``: third-party architectures built from their default configs, with random weights.

The levers were written on a few models (the demo, the llama workload, HF llama); the zoo is
what they are checked on and benchmarked against: decoder LLM families from transformers
(GPT-2 with its ``Conv1D`` projections and tied head, llama, qwen2, mistral, gemma, phi), a
mixture-of-experts (mixtral), an encoder masked LM (bert), an encoder-decoder (t5), vision
transformers (transformers ViT and Swin, timm's ViT-B/16 where timm is installed), convolutional
nets (transformers ResNet and ConvNeXt) and a hand-written nanoGPT-style model.

Every model keeps its config's defaults as shipped: only the shapes (width, depth, heads,
vocabulary, image size) are set. So a GPT-2 trains with dropout and ``use_cache=True``, as a
user's ``GPT2LMHeadModel(GPT2Config(...))`` would: a lever that needs the KV cache off while
training turns it off itself (compile-blocks does), the factory does not do it for it.

    levers audit zoo --set model=gpt2
    levers audit zoo --set model=vit size=full device=cuda

Parameters: ``model`` (one of :data:`MODELS`), ``size`` (``tiny``: a step in well under a second
on a CPU; ``full``: the realistic shape ``bench/zoo.py`` times on an H200), ``device``
(cpu | cuda), ``dtype`` (parameter dtype, float32), ``seed`` (0), ``batch_size`` (per size),
``layers`` (the depth: repeated blocks per stack, or per stage for the staged vision models).

The step draws a fresh batch from a seeded generator each call (token ids, or images and class
labels), takes the model's loss, and trains it with a fused AdamW, under bf16 autocast on a GPU.
``tokens_per_step`` counts tokens for the text models (the encoder-decoder's input and target
tokens), patch tokens entering the first block for the vision transformers, and images for the
convolutional nets.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from levers.errors import MissingDependency
from levers.workload import Workload
from levers.workloads import _params, _runtime
from levers.workloads.zoo import nanogpt, text, vision
from levers.workloads.zoo.spec import SIZES, ZooModel

LEARNING_RATE = 1e-4

# name -> the model's entry; the order is the order of `bench/zoo.py` and of the docs
MODELS: dict[str, ZooModel] = {m.name: m for m in (*text.MODELS, *vision.MODELS, nanogpt.MODEL)}


def names(*, available_only: bool = False) -> list[str]:
    """The zoo's model names; with ``available_only``, only those whose library is installed."""
    return [n for n, m in MODELS.items() if not available_only or m.available() is None]


def build(
    *,
    model: str = "gpt2",
    size: str = "tiny",
    device: Any = "cpu",
    dtype: Any = "float32",
    seed: Any = 0,
    batch_size: Any = None,
    layers: Any = None,
) -> Workload:
    """Build one zoo model's workload; see the module docstring for the parameters."""
    _params.choice("model", model, tuple(MODELS))
    return build_entry(
        MODELS[model],
        {"model": model},
        size=size,
        device=device,
        dtype=dtype,
        seed=seed,
        batch_size=batch_size,
        layers=layers,
        name=f"zoo-{model}-{size}",
    )


def _parameters_to(module: torch.nn.Module, device: torch.device) -> None:
    """Move to ``device`` the parameters the build left elsewhere: one made by a legacy
    constructor (XLNet's ``torch.FloatTensor(...)``) ignores the default device and stays on
    the CPU. Only those are replaced (a tied one once, so it stays tied): ``Module.to`` would
    swap every parameter, which a model built on levers memory's fake tensors may refuse
    (LeViT's attention biases, held in a cache)."""
    if device.type != "cuda":
        return
    moved: dict[int, torch.nn.Parameter] = {}
    for owner in module.modules():
        for name, param in list(owner._parameters.items()):
            if param is None or param.is_cuda:
                continue
            if id(param) not in moved:
                moved[id(param)] = torch.nn.Parameter(
                    param.detach().to(device), requires_grad=param.requires_grad
                )
            owner._parameters[name] = moved[id(param)]


def build_entry(
    entry: ZooModel,
    identity: dict[str, Any],
    *,
    size: str,
    device: Any,
    dtype: Any,
    seed: Any,
    batch_size: Any,
    layers: Any,
    name: str,
) -> Workload:
    """The workload of one entry at ``size``: the zoo's, and the ``arch`` workload's for the
    architectures it builds from transformers' and timm's registries. ``identity`` (the
    parameters that name the model: ``model``, and ``task`` for ``arch``) leads the workload's
    recorded parameters, so that the factory rebuilds it from them."""
    _params.choice("size", size, SIZES)
    resolved_device = _params.device(device)
    param_dtype = _params.dtype(dtype)
    resolved_seed = _params.integer("seed", seed)
    shape = dict(entry.sizes[size])
    if batch_size is not None:
        shape["batch_size"] = _params.positive_int("batch_size", batch_size)
    if layers is not None:
        shape["layers"] = _params.positive_int("layers", layers)
    shape["param_dtype"] = param_dtype  # the images are drawn in it
    layers_named = "" if shape["layers"] is None else f", layers={shape['layers']:,}"
    _runtime.check_step_fits(
        ", ".join(f"{key}={value}" for key, value in identity.items())
        + f", size={size}, batch_size={shape['batch_size']:,}{layers_named}",
        step_floor(entry, shape), resolved_device, param_dtype, "batch_size or layers",
    )
    missing = entry.available()
    if missing is not None:
        raise MissingDependency(missing)
    with (
        _runtime.seeded(resolved_seed, resolved_device),
        _runtime.default_dtype(param_dtype),
        resolved_device,
    ):
        module = entry.make_model(shape)
    _parameters_to(module, resolved_device)
    module.train()
    optimizer = _runtime.adamw(module, lr=LEARNING_RATE)
    generator = _runtime.data_generator(resolved_seed, resolved_device)
    return Workload(
        model=module,
        step=training_step(entry, module, optimizer, shape, generator),
        tokens_per_step=entry.tokens_per_step(shape),
        optimizer=optimizer,
        name=name,
        params={
            **identity,
            "size": size,
            "device": str(resolved_device),
            "dtype": _params.dtype_name(param_dtype),
            "seed": resolved_seed,
            "batch_size": shape["batch_size"],
            "layers": shape["layers"],
        },
        device=resolved_device,
    )


def step_floor(entry: ZooModel, shape: dict[str, Any]) -> _runtime.StepFloor:
    """The least one step of a zoo model holds, from the fields its shape has: its MLPs'
    weights and embedding, the batch (token ids, or images in the parameter dtype), each
    block's input and a language model's logits."""
    # a field the shape has as None (a config that ships no hidden_size: ResNet's) counts 0
    width, batch = shape.get("width") or 0, shape["batch_size"]
    layers = shape["layers"] or 0  # None: a timm model's registered depth, not in the shape
    vocab = shape.get("vocab_size") or 0
    tokens = entry.tokens_per_step(shape)
    if "image_size" in shape:
        side = shape["image_size"]  # an int, or timm's (height, width)
        pixels = side[0] * side[1] if isinstance(side, tuple) else side**2
        batch_bytes = batch * shape.get("channels", 3) * pixels * shape["param_dtype"].itemsize
        logits = 0
    else:
        lengths = shape.get("seq_len", 0) + shape.get("target_len", 0)
        batch_bytes = batch * lengths * 8
        # the encoder-decoder's logits are over its targets; the others' over every token
        scored = shape["target_len"] if entry.family == "encoder-decoder" else shape["seq_len"]
        logits = batch * scored * vocab
    return _runtime.StepFloor(
        parameters=vocab * width + layers * 2 * width * (shape.get("ffn") or 0),
        batch_bytes=batch_bytes,
        kept_per_block=tokens * width,
        num_blocks=layers,
        logits=logits,
    )


def training_step(
    entry: ZooModel,
    module: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    shape: dict[str, Any],
    generator: torch.Generator,
) -> Callable[[], torch.Tensor]:
    """A fresh batch, the model's loss, backward, AdamW."""
    device = generator.device

    def step() -> torch.Tensor:
        inputs = entry.make_batch(shape, generator)
        with _runtime.autocast(device):
            loss = entry.loss(module, inputs)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    return step
