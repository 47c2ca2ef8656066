"""``arch``: any architecture of transformers' auto mappings or timm's registry, shrunk or at a
realistic shape, with random weights: the zoo beyond its fifteen hand-picked models.

    levers audit arch --set model=opt task=causal-lm
    levers ab arch --set model=bloom task=causal-lm size=full device=cuda --lever compile-blocks
    levers tune arch --set model=timm:convnext_atto size=full device=cuda

Parameters:

- ``model``: a transformers ``model_type`` of the causal LM, masked LM, seq2seq LM or image
  classification auto mapping (``opt``, ``bloom``, ``gpt_neox``, ``deberta-v2``, ``bart``,
  ``deit``...), or ``timm:<name>`` for a timm model (``timm:resnet18``; needs timm);
- ``task``: ``causal-lm``, ``masked-lm``, ``seq2seq`` or ``image-classification``; needed only
  when the model type is in several mappings (``bart``: causal-lm, masked-lm, seq2seq);
- ``size``: ``tiny`` (a step in about a second on a CPU) or ``full`` (a realistic shape for one
  H200: a decoder at width 2048, 8 blocks, 16 heads, batch 8 x 2048; an encoder at bert-base's
  shape, batch 32 x 512; an encoder-decoder at t5-base's, batch 16 x (512 + 128); an image
  classifier at its shipped config, batch 64); see
  :mod:`levers.workloads.arch.transformers_models` and :mod:`levers.workloads.arch.timm_models`
  for what is shrunk and how;
- ``device``, ``dtype``, ``seed``, ``batch_size``, ``layers`` as for ``zoo`` (``layers``: blocks
  per stack, or in the shallowest stage of a staged vision model).

Every config field but the shapes keeps its shipped default (dropout, ``use_cache``, positional
scheme, activations), as ``AutoModelFor<Task>.from_config(AutoConfig.for_model(type, ...))``
builds it for a user. The step is the zoo's (:func:`levers.workloads.zoo.build_entry`): a fresh
seeded batch (token ids and labels, -100 outside the masked 15% for a masked LM; input ids,
decoder input ids and shifted labels for seq2seq; images and class labels), the model's loss
(cross-entropy over a timm model's logits), backward and a fused AdamW, under bf16 autocast on a
GPU. ``tokens_per_step`` counts tokens (seq2seq: input and target), patch tokens for a vision
transformer with one patch size, and images otherwise.

``bench/arch_sweep.py`` builds every architecture this can at ``tiny`` and runs each lever's
contract on it (applies, parity, undo): ``bench/results/arch_sweep_cpu/summary.md``.
"""

from __future__ import annotations

from typing import Any

from levers.errors import LeversError
from levers.workload import Workload
from levers.workloads import _params
from levers.workloads.arch import timm_models, transformers_models
from levers.workloads.arch.transformers_models import TASKS, architectures, tasks_of
from levers.workloads.zoo import build_entry
from levers.workloads.zoo.spec import ZooModel

__all__ = ["TASKS", "architectures", "build", "entry", "resolve_task"]


def resolve_task(model: str, task: str | None) -> str:
    """The task to build ``model`` for: ``task`` when given (checked), else the only one of its
    mappings; raises ValueError with what to pass."""
    if model.startswith(timm_models.PREFIX):
        if task not in (None, "image-classification"):
            raise ValueError(f"task={task!r}: a timm model is an image classifier")
        return "image-classification"
    if task is not None:
        _params.choice("task", task, TASKS)
    available = tasks_of(model)
    named, _, named_task = model.partition("/")
    if not available and named_task in TASKS and tasks_of(named):
        # the sweeps' name of an architecture and its task (bench's arch@xlm/masked-lm)
        raise ValueError(
            f"model={model!r} names a task: write it as model={named} task={named_task}"
        )
    if not available:
        import transformers

        raise ValueError(
            f"model={model!r} is not a model type of transformers' auto mappings for "
            f"{', '.join(TASKS)} (transformers {transformers.__version__}); write a model_type "
            "such as opt, bloom, gpt_neox, deberta-v2, bart or deit (`python bench/arch_sweep.py "
            "--list` lists them all), or timm:<name> for a timm model"
        )
    if task is None:
        if len(available) > 1:
            raise ValueError(
                f"model={model!r} is in several auto mappings; pass task= one of: "
                f"{', '.join(available)}"
            )
        return available[0]
    if task not in available:
        raise ValueError(
            f"model={model!r} has no {task} class in transformers; its tasks: "
            f"{', '.join(available)}"
        )
    return task


def entry(model: str, task: str, layers: int | None = None) -> ZooModel:
    """The zoo entry of one architecture (its builder, batches, sizes)."""
    if model.startswith(timm_models.PREFIX):
        return timm_models.entry(model[len(timm_models.PREFIX):], layers)
    return transformers_models.entry(model, task)


def build(
    *,
    model: str = "opt",
    task: str | None = None,
    size: str = "tiny",
    device: Any = "cpu",
    dtype: Any = "float32",
    seed: Any = 0,
    batch_size: Any = None,
    layers: Any = None,
) -> Workload:
    """Build one architecture's workload; see the module docstring for the parameters."""
    if not isinstance(model, str) or not model:
        raise ValueError("model= names a transformers model_type (opt) or timm:<name>")
    resolved_task = resolve_task(model, task)
    depth = None if layers is None else _params.positive_int("layers", layers)
    try:
        chosen = entry(model, resolved_task, depth)
    except ImportError as exc:
        raise LeversError(f"the arch model {model!r} needs a package that is missing: {exc}")
    identity = {"model": model, "task": resolved_task}
    return build_entry(
        chosen,
        identity,
        size=size,
        device=device,
        dtype=dtype,
        seed=seed,
        batch_size=batch_size,
        layers=depth,
        name=f"arch-{model.replace(':', '-')}-{resolved_task}-{size}",
    )
