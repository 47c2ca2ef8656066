"""``compile-loss``: ``torch.compile`` of a Hugging Face language model's loss function.

A Hugging Face LM computes its loss through ``self.loss_function`` (transformers'
``ForCausalLMLoss``: the logits upcast to fp32, the labels shifted, ``F.cross_entropy``). Run
eagerly, that is several full passes over a [tokens, vocabulary] tensor that do no useful math:
the fp32 copy of the logits, the log-probabilities kept for backward, the gradient written as
zeros and scattered, the softmax gradient, its cast back to the head's dtype (LOSS002 counts
them). At 8192 tokens and a 32k vocabulary each fp32 pass is 1 GiB. Compiled, inductor reads
the logits once for the forward (max and sum of exponentials in one kernel, keeping one float a
row) and once for the backward, which writes the gradient in the head's dtype directly.

This is what torchtitan's recipe does beside its per-block compile (``compile.components``:
``model`` and ``loss``, the loss a ``torch.compile``d function of its own), and torchtune's
``compile_loss``. Per-block compile (compile-blocks) leaves the loss eager; whole-model compile
(compile-model) compiles it with the model, so it covers this lever.

The model's ``loss_function`` (a settable property of ``PreTrainedModel``) is set to the
compiled function while the lever is on; the undo removes it, and the model reads transformers'
mapping again. The compiled function is kept per function and options, so a re-apply after an
undo (``levers tune -- python train.py`` applies and undoes between windows) reuses what dynamo
compiled. It applies where the forward calls ``self.loss_function`` and that is transformers'
own causal-LM or masked-LM cross-entropy; a loss the model or another lever set already is left
as it is.

Options: ``backend`` (default "inductor"), ``mode``, ``dynamic``, ``fullgraph``.

Fix safety: changes numerics (the fp32 log-sum-exp reduced in another order). Tolerance checked:
1e-5 relative in fp32.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from levers.levers import register
from levers.levers._compile_options import check_compile_options, compile_kwargs
from levers.levers._compile_setup import is_compiled, liger_patched, quiet_autotuning
from levers.levers._find import forward_source, is_hf_model
from levers.levers._patch import Undos
from levers.levers.lever import Lever, Target
from levers.vocab import CHANGES_NUMERICS

ID = "compile-loss"
OPTIONS = ("backend", "mode", "dynamic", "fullgraph")


def check(options: dict[str, Any]) -> None:
    check_compile_options(ID, options)


# transformers' loss functions over a vocabulary (LOSS_MAPPING's values, by name): where the
# logits are [tokens, vocabulary] and the eager passes over them cost what this lever saves
LM_LOSSES = ("ForCausalLMLoss", "ForMaskedLMLoss")
# (function, options) -> its compiled form, so that a re-apply reuses dynamo's cache
_COMPILED: dict[tuple[Any, tuple[tuple[str, Any], ...]], Callable[..., Any]] = {}


def applies(target: Target) -> str | None:
    model = target.model
    if not is_hf_model(model):
        return (
            "not a Hugging Face model: compile your own loss function where the step computes "
            "it (loss_fn = torch.compile(loss_fn))"
        )
    if is_compiled(model):
        return "the whole model is compiled (compile-model), its loss with it"
    if liger_patched(model):
        return "the model runs Liger Kernel's kernels, whose loss is fused already"
    if "self.loss_function(" not in (forward_source(model) or ""):
        return (
            f"{type(model).__name__}'s forward does not compute its loss through "
            "self.loss_function: it calls its loss itself (as transformers' BERT-family masked "
            "LMs and its older causal LMs do)"
        )
    if "_loss_function" in vars(model):
        return "its loss_function is set already (by another lever, or by your code)"
    name = getattr(model.loss_function, "__name__", type(model.loss_function).__name__)
    if name not in LM_LOSSES:
        return (
            f"its loss ({name}) is not a language model's cross-entropy over a vocabulary, "
            "where compiling the loss pays"
        )
    return None


def _compiled(function: Callable[..., Any], options: dict[str, Any]) -> Callable[..., Any]:
    key = (function, tuple(sorted(options.items())))
    if key not in _COMPILED:
        _COMPILED[key] = torch.compile(function, **options)
    return _COMPILED[key]


def patch(target: Target) -> Callable[[], None]:
    options = compile_kwargs(ID, target.options, OPTIONS)
    model = target.model
    undos = Undos()
    undos.add(quiet_autotuning(options.get("mode")))
    # the loss_function property reads _loss_function first; deleting it restores the default
    undos.set_attr(model, "_loss_function", _compiled(model.loss_function, options))
    return undos


LEVER = register(
    Lever(
        options=OPTIONS,
        check=check,
        id=ID,
        title="torch.compile the language model's loss (the fp32 cross-entropy over the logits)",
        safety=CHANGES_NUMERICS,
        tolerance=1e-5,
        fixes=("LOSS002",),
        applies=applies,
        patch=patch,
        needs_gpu=True,
        known_problems=(
            "Hugging Face models whose forward calls self.loss_function only (most causal LMs; "
            "BERT-family masked LMs and transformers' older causal LMs compute their loss "
            "themselves); the first step pays the "
            "loss's compile; a new logits shape recompiles (dynamo turns it dynamic after one); "
            "the head's matmul stays outside (fused-linear-cross-entropy fuses it, at its own "
            "cost)"
        ),
    )
)
