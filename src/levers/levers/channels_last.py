"""``channels-last``: the model's 2-D convolutions in channels-last (NHWC) memory format.

cuDNN runs bf16 and fp16 convolutions on tensor cores in NHWC; given NCHW tensors it converts to
and from that layout around each convolution, or picks slower kernels. PyTorch's performance
guide and timm's training script (``--channels-last``) convert a convnet's weights to
``torch.channels_last`` for this: a convolution whose weight is channels-last writes its output
channels-last, and batch norm, activations, additions and poolings keep the format, so the
activations flow in NHWC from the first convolution on (cuDNN converts the batch once there;
the batch is left as the step draws it).

The lever converts the weight of every ``nn.Conv2d`` (its gradient and its optimizer state too,
where they exist: a fused optimizer expects a parameter's state in its layout) with
``param.data = ...`` (the same Parameter objects, which the optimizer and hooks hold). The undo
converts each back to contiguous. Values are unchanged; the convolution kernels differ.

Found by pattern: two or more ``nn.Conv2d`` modules (a ViT's, a Swin's, a Hiera's single patch
embedding gains nothing). Refused on a model compiled already (the compiled program holds the
weights' layout: apply it first, as ``levers tune`` does) and on one wrapped for data parallelism
(DDP's gradient buckets take the layout of the parameters it was built on).

Fix safety: changes numerics (other convolution algorithms accumulate in another order).
Tolerance checked: 1e-4 relative per gradient after three steps in fp32 on a CPU (measured
up to 2e-5, on batch norm's 8-value biases; the losses within 2e-7).
"""

from __future__ import annotations

from typing import Callable

import torch

from levers.levers import register
from levers.levers._compile_setup import is_compiled
from levers.levers.lever import Lever, Target
from levers.vocab import CHANGES_NUMERICS

CHANNELS_LAST = torch.channels_last


def _convolutions(model: torch.nn.Module) -> list[torch.nn.Conv2d]:
    return [m for m in model.modules() if isinstance(m, torch.nn.Conv2d)]


def _weights(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The 4-D weights of the model's 2-D convolutions, each once (a shared weight too)."""
    seen: dict[int, torch.nn.Parameter] = {}
    for conv in _convolutions(model):
        weight = conv.weight
        if isinstance(weight, torch.nn.Parameter) and weight.dim() == 4:
            seen.setdefault(id(weight), weight)
    return list(seen.values())


def _data_parallel(model: torch.nn.Module) -> str | None:
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return "DistributedDataParallel"
    if any(type(p).__name__ == "DTensor" for p in model.parameters()):
        return "FSDP (its parameters are DTensors)"
    return None


def applies(target: Target) -> str | None:
    model = target.model
    convolutions = _convolutions(model)
    if len(convolutions) < 2:
        return (
            f"{len(convolutions)} 2-D convolution{'' if len(convolutions) == 1 else 's'} in the "
            "model: a convnet's layout lever (a single patch embedding gains nothing)"
        )
    weights = _weights(model)
    if weights and all(w.is_contiguous(memory_format=CHANNELS_LAST) for w in weights):
        return "the convolutions' weights are channels-last already"
    if is_compiled(model) or any(is_compiled(m) for m in model.modules()):
        return (
            "the model is compiled already, and the compiled program holds the weights' layout: "
            "apply channels-last before compile-model or compile-blocks"
        )
    wrapper = _data_parallel(model)
    if wrapper is not None:
        return (
            f"the model is wrapped in {wrapper}, whose gradient buckets follow the layout the "
            "parameters had: convert the model (model.to(memory_format=torch.channels_last)) "
            "before wrapping it"
        )
    return None


def _to_format(
    weights: list[torch.nn.Parameter], optimizer: torch.optim.Optimizer | None,
    memory_format: torch.memory_format,
) -> None:
    """Each weight, its gradient and its optimizer state of its shape, in ``memory_format``."""
    for weight in weights:
        weight.data = weight.data.contiguous(memory_format=memory_format)
        if weight.grad is not None:
            weight.grad = weight.grad.contiguous(memory_format=memory_format)
        state = optimizer.state.get(weight, {}) if optimizer is not None else {}
        for key, value in list(state.items()):
            if isinstance(value, torch.Tensor) and value.shape == weight.shape:
                state[key] = value.contiguous(memory_format=memory_format)


def patch(target: Target) -> Callable[[], None]:
    # only the weights not channels-last already: the undo gives back exactly what it changed
    weights = [w for w in _weights(target.model)
               if not w.is_contiguous(memory_format=CHANNELS_LAST)]
    optimizer = target.optimizer
    _to_format(weights, optimizer, CHANNELS_LAST)

    def undo() -> None:
        _to_format(weights, optimizer, torch.contiguous_format)

    undo.converted = len(weights)  # type: ignore[attr-defined]
    return undo


LEVER = register(
    Lever(
        id="channels-last",
        title="Run the 2-D convolutions in channels-last (NHWC) memory format",
        safety=CHANGES_NUMERICS,
        tolerance=1e-4,
        fixes=(),
        applies=applies,
        patch=patch,
        needs_gpu=True,
        float64_faithful=True,  # model.to(torch.float64) keeps the weights channels-last
        known_problems=(
            "a model that calls .view() on a convolution's output (rather than .reshape()) "
            "fails on channels-last activations (the A/B then reports the error); inductor "
            "chooses its convolutions' layout itself, so under whole-model compile it may add "
            "little (not measured yet)"
        ),
    )
)
