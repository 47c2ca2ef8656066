"""What the data levers share: the step's batches, and whether the model keeps documents apart.

A packed or flattened batch holds several sequences in one row. The model must keep attention
inside each one, or every sequence but the first in a row attends to the ones before it: the
loss still looks like a loss, and nothing fails. levers does not write its own attention for
this; it relies on Hugging Face transformers, which recognises packed rows from
``position_ids`` that restart when there is no ``attention_mask``:

- ``eager``, ``sdpa`` and ``flex_attention`` build their mask from it (``create_causal_mask`` ->
  ``find_packed_sequence_indices``: a document mask, a block-causal BlockMask for flex), for any
  number of rows;
- ``flash_attention_2`` and ``flash_attention_3`` turn it into varlen boundaries (``cu_seqlens``)
  only for a batch of one row (``_is_packed_sequence`` checks ``batch_size == 1``): padding-free,
  never packed rows.

transformers reads the restarts only when the forward builds no KV cache, so the levers turn
the config's ``use_cache`` off while they are on (:func:`relayout`). Anything else is refused.
Where the model can run (not on fake or meta tensors), the claim is
also measured, not trusted: :func:`document_leak` runs the model on two short documents packed
in a row and on the second alone (eval mode, no grad, 8 tokens) and refuses the lever when the
second one's logits differ.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable

import torch
from torch._subclasses.fake_tensor import FakeTensor

from levers.batches import Batches, batches_of
from levers.levers._find import training_cache_off
from levers.levers.lever import Target

MASK_IMPLEMENTATIONS = frozenset({"eager", "sdpa", "flex_attention"})
ONE_ROW_IMPLEMENTATIONS = frozenset({"flash_attention_2", "flash_attention_3"})
# the probe's logits: a leak moves them by a share of their size, rounding by far less
LEAK_RTOL = {torch.float32: 1e-4, torch.float64: 1e-8}
LEAK_RTOL_LOW_PRECISION = 2e-2
NO_BATCHES = (
    "the step exposes no batches to change: the data levers act on a step that draws its "
    "batches through levers.batches.Batches (the hf workload with lengths=longtail or varied; a "
    "factory sets step.batches = Batches(draw=...)) or on a Trainer's collator "
    "(levers.apply(trainer, ...))"
)


def token_count_option(options: dict[str, Any], spec: str, default: int | None) -> int | None:
    """A positive number of tokens from a lever's options (``spec`` is ``"lever:name"``, for the
    message); ``default`` where the option is absent or empty."""
    name = spec.split(":", 1)[1]
    value = options.get(name)
    if value in (None, ""):
        return default
    try:
        count = int(value)
    except (TypeError, ValueError):
        count = 0
    if count <= 0:
        raise ValueError(f"{spec}={value!r} must be a positive number of tokens")
    return count


def batches(target: Target) -> Batches | None:
    """The batches the data levers change: a wrapped collator's, else the step's."""
    return target.batches if target.batches is not None else batches_of(target.step)


def padding_reason(found: Batches | None) -> str | None:
    """Why there is no padding to remove: no batches, no padding in them, or a layout already
    without it; None when the batches are padded."""
    if found is None:
        return NO_BATCHES
    if found.layout in ("packing", "padding-free"):
        return f"its batches are already laid out without padding (by {found.layout})"
    if found.lengths is not None and len(set(found.lengths)) == 1:
        return (
            f"its batches carry no padding: every sequence has {found.lengths[0]} tokens "
            "(nothing to pack)"
        )
    return None


def attention_reason(model: torch.nn.Module, *, rows: int) -> str | None:
    """Why ``model`` cannot be trusted to keep documents apart in ``rows`` packed rows (1 for
    padding-free), or None: its attention implementation, then the measured probe."""
    config = getattr(model, "config", None)
    impl = getattr(config, "_attn_implementation", None)
    if config is None or impl is None:
        return (
            "the model is not a Hugging Face transformers model: levers keeps packed documents "
            "apart through transformers' position_ids detection, and this model's attention "
            "would let each document attend to the ones before it in its row"
        )
    allowed = MASK_IMPLEMENTATIONS | (ONE_ROW_IMPLEMENTATIONS if rows == 1 else frozenset())
    if impl not in allowed:
        if impl in ONE_ROW_IMPLEMENTATIONS:
            return (
                f"attn_implementation={impl} keeps packed documents apart only in a batch of "
                "one row (transformers' _is_packed_sequence): use padding-free, or sdpa / "
                "flex_attention for packed rows"
            )
        return (
            f"attn_implementation={impl} is not one transformers keeps packed documents apart "
            f"in ({', '.join(sorted(allowed))}): attention would cross documents"
        )
    return document_leak(model, rows=rows)


def _first_param(model: torch.nn.Module) -> torch.Tensor | None:
    return next(model.parameters(), None)


def document_leak(model: torch.nn.Module, *, rows: int) -> str | None:
    """Run the model on a packed probe and on its second document alone; a sentence when the
    second document's logits differ (attention crossed), None when they agree or the model
    cannot run here (fake or meta tensors: the implementation check stands alone)."""
    param = _first_param(model)
    if param is None or param.device.type == "meta" or _is_fake(param):
        return None
    device, vocab = param.device, int(getattr(model.config, "vocab_size", 16) or 16)
    first = torch.arange(5, device=device) % vocab + 1
    second = torch.arange(3, device=device) % vocab + 7
    ids = torch.cat([first, second])[None]
    positions = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2]], device=device)
    if rows > 1:  # a second row of one sequence: the batch flash attention does not see packed
        ids = torch.cat([ids, (torch.arange(8, device=device) % vocab)[None]])
        positions = torch.cat([positions, torch.arange(8, device=device)[None]])
    was_training = model.training
    model.eval()
    try:
        # eager even where blocks are compiled: the probe's 8 tokens must not cost a compile
        with torch.no_grad(), _eager():
            extra = _no_cache_kwargs(model)
            packed = model(input_ids=ids, position_ids=positions, **extra).logits[0, 5:].float()
            alone = model(
                input_ids=second[None], position_ids=positions[:1, :3], **extra
            ).logits[0].float()
    except Exception as exc:  # noqa: BLE001 - a model that cannot run the probe is not trusted
        return (
            f"the check that attention stays inside each document could not run "
            f"({type(exc).__name__}: {exc})"
        )
    finally:
        model.train(was_training)
    rtol = LEAK_RTOL.get(param.dtype, LEAK_RTOL_LOW_PRECISION)
    diff = float((packed - alone).abs().max())
    scale = float(alone.abs().max()) or 1.0
    if diff > rtol * scale:
        impl = model.config._attn_implementation
        return (
            f"attention crosses documents here: with attn_implementation={impl}, the second of "
            f"two packed documents gets other logits than alone (max difference {diff:.3g}, "
            f"{diff / scale:.1%} of their size)"
        )
    return None


def _no_cache_kwargs(model: torch.nn.Module) -> dict[str, Any]:
    """``use_cache=False`` for a model whose config has a KV cache switch: as the step runs with
    the lever on (:func:`relayout`)."""
    return {"use_cache": False} if hasattr(model.config, "use_cache") else {}


def relayout(target: Target, lever_id: str, layout: Any) -> Callable[[], None]:
    """Lay the target's batches out anew while the lever is on: ``layout(batch, lengths)`` on each
    batch, ``lengths`` the workload's own (the same every step, so no device read per step) or
    None, and the config's KV cache off (transformers looks for packed sequences only without a
    cache: ``_preprocess_mask_arguments`` reads the position ids when ``cache is None``, and a
    config as shipped builds one in every forward, so attention would cross documents). Returns
    the undo of both."""
    found = batches(target)
    known = found.lengths
    undo_transform = add_transform(found, lever_id, lambda batch: layout(batch, known))
    undo_cache = training_cache_off(target.model)

    def undo() -> None:
        undo_transform()
        undo_cache()

    return undo


def _eager() -> Any:
    set_stance = getattr(torch.compiler, "set_stance", None)
    return set_stance("force_eager") if set_stance is not None else contextlib.nullcontext()


def _is_fake(tensor: Any) -> bool:
    return isinstance(tensor, FakeTensor)


def add_transform(found: Batches, lever_id: str, transform: Any):
    """Append ``(lever_id, transform)`` to the batches; returns the undo that removes it."""
    entry = (lever_id, transform)
    found.transforms.append(entry)

    def undo() -> None:
        found.transforms[:] = [e for e in found.transforms if e is not entry]

    return undo
