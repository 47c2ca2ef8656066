"""``loss-valid-rows``: compute the loss over the rows whose target is not ``ignore_index``.

- Hugging Face causal LMs: the model's ``loss_function`` is replaced by one that selects the real
  rows of the logits before the fp32 upcast and the cross-entropy, so neither the fp32 copy nor
  the loss's backward touches a padding row. Finding the rows costs one host read per step
  (``nonzero``); it pays where a large share of the rows is padding.
- the ``demo``: its ``loss`` switch, which gathers the real rows before the LM head (so the head
  itself skips them), with row indices known on the host.

In user code the fix is an edit (LOSS001's receipt names the line): gather the rows with a real
target before the head, with indices built on the host.

Fix safety: changes numerics only in summation order (ignored rows contribute zero). Tolerance
checked: 1e-5 relative in fp32.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F

from levers.levers import register
from levers.levers._demo import has_switch, switch_on
from levers.levers._find import hf_causal_lm_parts
from levers.levers._patch import Undos
from levers.levers.lever import Lever, Target
from levers.vocab import CHANGES_NUMERICS

MARK = "_levers_loss_valid_rows"


def causal_lm_loss_valid_rows(
    logits: torch.Tensor,
    labels: torch.Tensor,
    vocab_size: int,
    num_items_in_batch: Any = None,
    ignore_index: int = -100,
    shift_labels: torch.Tensor | None = None,
    **_: Any,
) -> torch.Tensor:
    """Hugging Face's causal-LM loss (shift, fp32, mean over real targets) on the real rows only."""
    if shift_labels is None:
        shift_labels = F.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    targets = shift_labels.reshape(-1).to(logits.device)
    rows = (targets != ignore_index).nonzero().squeeze(1)  # sync point: the number of real rows
    picked = logits.reshape(-1, vocab_size).index_select(0, rows).float()
    loss = F.cross_entropy(picked, targets.index_select(0, rows), reduction="sum")
    if num_items_in_batch is None:
        return loss / rows.numel()
    if isinstance(num_items_in_batch, torch.Tensor):
        num_items_in_batch = num_items_in_batch.to(loss.device)
    return loss / num_items_in_batch


def applies(target: Target) -> str | None:
    model = target.model
    if getattr(model, MARK, False):
        return "already applied to this model"
    if has_switch(model, "loss"):
        return None
    parts = hf_causal_lm_parts(model)
    if isinstance(parts, str):
        return (
            f"no recognised loss over padded rows ({parts}); in your own code, gather the rows "
            "with a real target before the head"
        )
    return None


def patch(target: Target) -> Callable[[], None]:
    model = target.model
    undos = Undos()
    if has_switch(model, "loss"):
        undos.add(switch_on(model, "loss"))
    else:
        # the loss_function property reads _loss_function first; deleting it restores the default
        undos.set_attr(model, "_loss_function", causal_lm_loss_valid_rows)
    undos.set_attr(model, MARK, True)
    return undos


LEVER = register(
    Lever(
        id="loss-valid-rows",
        title="Compute the loss over the rows with a real target only",
        safety=CHANGES_NUMERICS,
        tolerance=1e-5,
        fixes=("LOSS001", "COPY002"),
        applies=applies,
        patch=patch,
        known_problems=(
            "on a Hugging Face model the head still projects every row (use "
            "fused-linear-cross-entropy to skip them there); with no padding it only adds a sync"
        ),
    )
)
