"""``loss-valid-rows``: compute the loss over the rows whose target is not ``ignore_index``.

- Hugging Face causal LMs: the model's ``loss_function`` is replaced by one that selects the real
  rows of the logits before the fp32 upcast and the cross-entropy, so neither the fp32 copy nor
  the loss's backward touches a padding row. Finding the rows costs one host read per step
  (``nonzero``); it pays where a large share of the rows is padding.
- Hugging Face masked LMs (``*ForMaskedLM``, and XLM's and Flaubert's ``*WithLMHeadModel`` of
  transformers' masked-LM mapping; not its encoder-decoders): the output projection itself gets only
  the tokens with a target. A masked LM's labels are ``-100`` on every token but the masked ones
  (85% of them at BERT's 15% masking), yet the model projects every token onto the vocabulary (BERT
  at 32 x 512: 16384 rows x 30522 logits, ~20% of the step's FLOPs, and their fp32 cross-entropy),
  and the loss then drops the unmasked rows. The model's forward is wrapped: where ``labels`` is
  given, the rows with a target are found (one host read a step), the labels passed on are those
  rows', and a pre-hook on the projection (``get_output_embeddings()``) selects the same rows of its
  input. The loss (the mean over the same targets) and every gradient are the unchanged step's, up
  to summation order; ModernBERT's ``sparse_prediction`` does the same. What changes is the model's
  output: its ``logits`` hold the rows with a target only (1, rows, vocabulary), in order, then
  padding rows (the first token's, their label ``-100``) up to a bucket, so code that reads the
  logits of every token (an accuracy over all of them) must not run with the lever on while
  training. A forward without labels, and every forward in evaluation mode (``model.eval()``: a
  Trainer's evaluation and its metrics), is untouched.
- the ``demo``: its ``loss`` switch, which gathers the real rows before the LM head (so the head
  itself skips them), with row indices known on the host.

The number of rows with a target differs from batch to batch (BERT's masking draws it), so the
rows taken are padded up to a multiple of a bucket (:func:`padded_rows`: a power of two near a
64th of the batch's tokens), with ``ignore_index`` as their label: the loss and the gradients do
not see them. A compiled step then meets a few shapes, not one per batch: under whole-model
compile with CUDA graphs, unpadded, every new count recorded a graph of its own (luke on an H100,
s61: nine sizes in one A/B, 0.74x on top of compile-model). The rows, their labels and their
count are found eagerly (:func:`rows_and_labels`, outside dynamo's trace), so the compiled graphs
after it get the padded sizes only: traced, the count itself reached them as an input, and they
still met one size per batch (s62: 0.97x).

In user code the fix is an edit (LOSS001's receipt names the line): gather the rows with a real
target before the head, with indices built on the host.

Fix safety: changes numerics only in summation order (ignored rows contribute zero). Tolerance
checked: 1e-5 relative in fp32.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch
import torch.nn.functional as F

from levers.levers import register
from levers.levers._demo import has_switch, switch_on
from levers.levers._find import hf_causal_lm_parts, hf_masked_lm_head
from levers.levers._patch import Undos, wrap_forward
from levers.levers.lever import Lever, Target
from levers.vocab import CHANGES_NUMERICS

MARK = "_levers_loss_valid_rows"
IGNORE_INDEX = -100  # transformers' masked-LM losses ignore this label


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
    rows, labels, real = rows_and_labels(targets, ignore_index)  # sync point: the real rows' count
    picked = logits.reshape(-1, vocab_size).index_select(0, rows).float()
    loss = F.cross_entropy(picked, labels, ignore_index=ignore_index, reduction="sum")
    if num_items_in_batch is None:
        return loss / real
    if isinstance(num_items_in_batch, torch.Tensor):
        num_items_in_batch = num_items_in_batch.to(loss.device)
    return loss / num_items_in_batch


# the rows taken are padded to a multiple of about this share of the batch's tokens
BUCKETS = 64
MIN_BUCKET = 8


def bucket(tokens: int) -> int:
    """The multiple the rows taken are padded to: the power of two nearest ``tokens / 64``, at
    least 8 (16384 tokens: 256; 1024: 16)."""
    if tokens <= 0:
        return MIN_BUCKET
    return max(MIN_BUCKET, 1 << max(0, round(math.log2(tokens / BUCKETS))))


def padded_rows(targets: torch.Tensor,
                ignore_index: int = IGNORE_INDEX) -> tuple[torch.Tensor, int]:
    """The indices of the flat ``targets`` that are not ``ignore_index``, in order, then index 0
    repeated up to the next multiple of :func:`bucket` (never past ``targets.numel()``); and the
    number of real rows. One host read (``nonzero``)."""
    real_rows = (targets != ignore_index).nonzero().squeeze(1)
    real = real_rows.numel()
    step = bucket(targets.numel())
    size = min(targets.numel(), -(-real // step) * step)
    if size == real:
        return real_rows, real
    return F.pad(real_rows, (0, size - real), value=0), real


def _labels_of(targets: torch.Tensor, rows: torch.Tensor, real: int,
               ignore_index: int = IGNORE_INDEX) -> torch.Tensor:
    """The labels of ``rows`` (from :func:`padded_rows`): the real rows' targets, then
    ``ignore_index`` on the padding."""
    labels = targets.index_select(0, rows[:real])
    return F.pad(labels, (0, rows.numel() - real), value=ignore_index)


@torch.compiler.disable
def rows_and_labels(targets: torch.Tensor, ignore_index: int = IGNORE_INDEX,
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`padded_rows` and their labels, with the number of real rows as a 0-dim tensor on
    ``targets``' device. Run eagerly inside a compiled model too: what the compiled code after it
    gets is tensors of the padded size only. Traced, the real count (an int) and ``nonzero``'s
    result (of that many rows) entered the graphs after the break as inputs, and CUDA graphs
    record one graph per new value of an input's size: on an H100 (s62) luke's whole-model
    compile with CUDA graphs met nine and ran 0.97x with the lever, where the rows were padded."""
    rows, real = padded_rows(targets, ignore_index)
    # the count read already, written on the device (a fill, not the mask and its sum again)
    count = torch.full((), real, dtype=torch.long, device=targets.device)
    return rows, _labels_of(targets, rows, real, ignore_index), count


def applies(target: Target) -> str | None:
    model = target.model
    if getattr(model, MARK, False):
        return "already applied to this model"
    if has_switch(model, "loss"):
        return None
    parts = hf_causal_lm_parts(model)
    if not isinstance(parts, str):
        return None
    head = hf_masked_lm_head(model)
    if not isinstance(head, str):
        return None
    return (
        f"no recognised loss over padded or unmasked rows (as a causal LM: {parts}; as a "
        f"masked LM: {head}); in your own code, gather the rows with a real target before the "
        "head"
    )


class _Rows:
    """The rows with a target of the forward in flight (None outside one), whether the model's
    head (the child module that holds the projection) was entered and whether the projection
    took them."""

    def __init__(self) -> None:
        self.rows: torch.Tensor | None = None
        self.tokens = 0
        self.reached = False
        self.taken = False


def _head_holder(model: torch.nn.Module, projection: torch.nn.Module) -> torch.nn.Module:
    """The child of ``model`` whose modules hold ``projection`` (BERT's ``cls``, RoBERTa's
    ``lm_head``), or the projection itself."""
    for child in model.children():
        if any(module is projection for module in child.modules()):
            return child
    return projection


def _masked_lm_forward(model: torch.nn.Module, rows: _Rows) -> Callable[[Callable[..., Any]],
                                                                        Callable[..., Any]]:
    name = type(model).__name__

    def wrap(forward: Callable[..., Any]) -> Callable[..., Any]:
        def forward_on_targets(*args: Any, **kwargs: Any) -> Any:
            labels = kwargs.get("labels")
            # an evaluation (model.eval(): a Trainer's metrics read every token's logits) and a
            # forward without labels run as they were
            if not model.training or not isinstance(labels, torch.Tensor) or rows.rows is not None:
                return forward(*args, **kwargs)
            flat = labels.reshape(-1)
            # sync point: the number of rows with a target
            picked, picked_labels, _ = rows_and_labels(flat)
            rows.rows, rows.tokens, rows.reached, rows.taken = picked, flat.numel(), False, False
            try:
                out = forward(*args, **{**kwargs, "labels": picked_labels[None]})
            except Exception as exc:
                # raised before the head (the model's own checks of its inputs, say), or by the
                # projection: the error is the model's, as it is
                if rows.taken or not rows.reached:
                    raise
                raise _not_taken(name) from exc  # the loss saw the rows' labels beside every logit
            finally:
                rows.rows = None
            if not rows.taken:
                raise _not_taken(name)
            return out

        return forward_on_targets

    return wrap


def _not_taken(name: str) -> RuntimeError:
    return RuntimeError(
        f"loss-valid-rows: {name}'s output projection was not called on the tokens during its "
        "forward, so the labels it was given (the rows with a target) do not match its logits; "
        "undo the lever on this model"
    )


def _projection_on_targets(rows: _Rows) -> Callable[..., Any]:
    def pre_hook(module: torch.nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
        if rows.rows is None:
            return None
        hidden = args[0]
        rows.taken = True  # reached: an error from here on is the projection's, said as it is
        if hidden.shape[:-1].numel() != rows.tokens:
            raise RuntimeError(
                f"loss-valid-rows: the output projection got {hidden.shape[:-1].numel()} rows "
                f"where the labels have {rows.tokens} tokens (the model projects something "
                "other than each token once); undo the lever on this model"
            )
        picked = hidden.reshape(-1, hidden.shape[-1]).index_select(0, rows.rows)[None]
        return (picked, *args[1:])

    return pre_hook


def patch(target: Target) -> Callable[[], None]:
    model = target.model
    undos = Undos()
    if has_switch(model, "loss"):
        undos.add(switch_on(model, "loss"))
    elif not isinstance(hf_causal_lm_parts(model), str):
        # the loss_function property reads _loss_function first; deleting it restores the default
        undos.set_attr(model, "_loss_function", causal_lm_loss_valid_rows)
    else:  # a masked LM (applies said yes)
        head = hf_masked_lm_head(model)
        assert not isinstance(head, str), head
        rows = _Rows()

        def entered(module: torch.nn.Module, args: tuple[Any, ...]) -> None:
            rows.reached = rows.reached or rows.rows is not None

        undos.add(_head_holder(model, head).register_forward_pre_hook(entered).remove)
        undos.add(head.register_forward_pre_hook(_projection_on_targets(rows)).remove)
        undos.add(wrap_forward(model, _masked_lm_forward(model, rows)))
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
            "on a Hugging Face causal LM the head still projects every row (use "
            "fused-linear-cross-entropy to skip them there); with no padding it only adds a sync; "
            "on a masked LM in training mode the model's logits hold the rows with a target "
            "only (then padding rows up to a bucket); model.eval() gets every token's"
        ),
    )
)
