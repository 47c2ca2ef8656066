"""``fused-linear-cross-entropy``: the LM head and the loss in one pass, never the full logits.

For a Hugging Face causal LM (``*ForCausalLM`` with an ``lm_head`` and the standard
``loss_function``), the model's forward is replaced, when ``labels`` are given, by: the base
model, then :func:`levers.levers._lce.linear_cross_entropy` over the final hidden states and the
head's weight with the labels shifted as Hugging Face shifts them (so ``num_items_in_batch`` and
``ignore_index`` mean what they meant). The output's ``logits`` is ``None`` in that case; a call
without ``labels`` (generation, evaluation) runs the original forward.

The kernel is Liger Kernel's fused linear cross-entropy or Cut Cross-Entropy on CUDA where
installed (``pip install 'levers[kernels]'``), and a chunked PyTorch version elsewhere (option
``kernel``: auto | liger | cce | chunked; ``chunk_rows``).

Fix safety: changes numerics (the loss is summed chunk by chunk). Tolerance checked: 1e-5
relative in fp32 with the chunked kernel.
"""

from __future__ import annotations

import functools
import re
from typing import Any, Callable

import torch
import torch.nn.functional as F

from levers.levers import register
from levers.levers._find import forward_source, head_forward_reason, hf_causal_lm_parts
from levers.levers._lce import (
    DEFAULT_CHUNK_ROWS,
    KERNELS,
    available_kernel,
    linear_cross_entropy,
)
from levers.levers._option_values import choice, count
from levers.levers._patch import Undos
from levers.levers.lever import Lever, Target
from levers.vocab import CHANGES_NUMERICS

ID = "fused-linear-cross-entropy"
MARK = "_levers_fused_linear_cross_entropy"
_LOSS_KWARGS = ("num_items_in_batch", "ignore_index", "shift_labels")


def logits_changed_after_head(model: torch.nn.Module) -> str | None:
    """The first line of the model's forward that changes the head's output before the loss
    (a soft cap, a scale, a slice), or None. The fused loss takes the head's raw logits, so any
    such line would be dropped; a change written under a config switch counts too, whatever
    the switch (a config that turns it off is refused all the same)."""
    source = forward_source(model)
    if source is None:
        return None
    lines = source.splitlines()
    head = next((i for i, line in enumerate(lines) if "self.lm_head(" in line), None)
    loss = next((i for i, line in enumerate(lines) if "self.loss_function(" in line), None)
    assigned = re.match(r"\s*(\w+)\s*=", lines[head]) if head is not None else None
    if assigned is None or loss is None or loss < head:
        return None
    changed = re.compile(rf"\s*{assigned.group(1)}\s*([-+*/]?=)(?!=)")
    return next((line.strip() for line in lines[head + 1 : loss] if changed.match(line)), None)


def applies(target: Target) -> str | None:
    model = target.model
    if getattr(model, MARK, False):
        return "already applied to this model"
    parts = hf_causal_lm_parts(model)
    if isinstance(parts, str):
        return (
            f"no recognised LM head + loss ({parts}); in your own code call "
            "levers.levers._lce.linear_cross_entropy(hidden, lm_head.weight, targets)"
        )
    own = head_forward_reason(parts[1])
    if own is not None:
        return f"{own}: the fused loss computes the logits from its weight alone"
    changed = logits_changed_after_head(model)
    if changed is not None:
        return (
            f"its forward changes the logits after the head ({changed}): the fused loss over "
            "the head's own logits would drop that"
        )
    try:
        available_kernel(parts[1].weight.device, target.options.get("kernel", "auto"))
    except ValueError as exc:
        return str(exc)
    return None


def check(options: dict[str, Any]) -> None:
    choice(ID, "kernel", options.get("kernel", "auto"), KERNELS)
    count(ID, "chunk_rows", options.get("chunk_rows", DEFAULT_CHUNK_ROWS))


def patch(target: Target) -> Callable[[], None]:
    model = target.model
    parts = hf_causal_lm_parts(model)
    assert not isinstance(parts, str), parts
    base, head = parts
    kernel = target.options.get("kernel", "auto")
    chunk_rows = count(ID, "chunk_rows", target.options.get("chunk_rows", DEFAULT_CHUNK_ROWS))
    original = model.forward

    @functools.wraps(original)
    def forward(*args: Any, labels: torch.Tensor | None = None, **kwargs: Any) -> Any:
        if labels is None or args or kwargs.get("logits_to_keep", 0) not in (0, None):
            return original(*args, labels=labels, **kwargs)
        from transformers.modeling_outputs import CausalLMOutputWithPast

        kwargs.pop("logits_to_keep", None)
        loss_kwargs = {k: kwargs.pop(k) for k in _LOSS_KWARGS if k in kwargs}
        ignore_index = loss_kwargs.get("ignore_index", -100)
        shift_labels = loss_kwargs.get("shift_labels")
        if shift_labels is None:
            shift_labels = F.pad(labels, (0, 1), value=ignore_index)[..., 1:]
        outputs = base(*args, **kwargs)
        hidden = outputs[0]
        loss = linear_cross_entropy(
            hidden.reshape(-1, hidden.shape[-1]),
            head.weight,
            shift_labels.reshape(-1).to(hidden.device),
            bias=head.bias,
            ignore_index=ignore_index,
            denominator=loss_kwargs.get("num_items_in_batch"),
            kernel=kernel,
            chunk_rows=chunk_rows,
        )
        return CausalLMOutputWithPast(
            loss=loss,
            logits=None,
            hidden_states=getattr(outputs, "hidden_states", None),
            attentions=getattr(outputs, "attentions", None),
        )

    undos = Undos()
    undos.set_attr(model, "forward", forward)
    undos.set_attr(model, MARK, True)
    return undos


# where the fused kernel was timed: Liger's, on the hf llama 1b (a 32,000-token vocabulary,
# batch 4 x 2048) on an H200, 0.98x tokens/s [0.976, 0.983] (the committed catalogue's row). Its
# saving is the logits it never writes, which grow with the vocabulary: a vocabulary up to twice
# that one is taken as that regime, a larger one is not known to lose and is tried
MEASURED_VOCAB = 32_000
MEASURED_RATIO = "0.98x"


def slower_here(target: Target) -> str | None:
    """Why the lever would cost time on this model: without a fused kernel (a CPU, a GPU without
    Liger or Cut Cross-Entropy installed) it runs the chunked PyTorch kernel, which recomputes
    each chunk's head matmul in the backward (a memory lever: it pays in memory and costs
    time); with a fused kernel, a vocabulary in the regime where it was measured slower
    (:data:`MEASURED_VOCAB`); None otherwise."""
    parts = hf_causal_lm_parts(target.model)
    if isinstance(parts, str):
        return None
    # off CUDA the kernel is the chunked one
    kernel = available_kernel(parts[1].weight.device, target.options.get("kernel", "auto"))
    if kernel == "chunked":
        return (
            "no fused kernel runs here, so it runs the chunked PyTorch kernel, which "
            "recomputes each chunk's head matmul in the backward: it saves memory and costs "
            "time (install liger-kernel, pip install 'levers[kernels]', for Liger's fused kernel)"
        )
    vocab = parts[1].weight.shape[0]
    if vocab <= 2 * MEASURED_VOCAB:
        return (
            f"its fused kernel ran {MEASURED_RATIO} tokens/s at a {MEASURED_VOCAB:,}-token "
            f"vocabulary (the hf llama 1b on an H200); this model's {vocab:,} is that regime, "
            "where the logits it saves writing are too small a share of the step: a memory lever"
        )
    return None


LEVER = register(
    Lever(
        options=("kernel", "chunk_rows"),
        check=check,
        id=ID,
        title="Fuse the LM head with the cross-entropy so the full logits never exist",
        safety=CHANGES_NUMERICS,
        tolerance=1e-5,
        fixes=("LOSS002", "LOSS001", "COPY002"),
        applies=applies,
        patch=patch,
        slower_here=slower_here,
        known_problems=(
            "outputs.logits is None when labels are given; the chunked fallback recomputes each "
            "chunk's head matmul in backward (about one extra head forward)"
        ),
    )
)
