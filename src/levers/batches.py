"""Variable-length batches: the batches a step trains on, and the layouts levers turn them into.

A *padded batch* is what a language-model step usually gets: a dict with ``input_ids`` [B, W],
``attention_mask`` [B, W] (1 on the real tokens of each row, contiguous) and ``labels`` [B, W]
(-100 on padding, and wherever the loss is to skip a token). Three layouts of the same sequences
remove or round that padding, each a pure function of the batch (:func:`pack`, :func:`flatten`,
:func:`pad_to_multiple`):

- *packed*: the sequences laid first-fit-decreasing into rows of ``row_len`` tokens, the rest of
  each row filled; ``position_ids`` restart at 0 for every sequence (and for the filler) and
  there is no ``attention_mask``, which is how Hugging Face transformers recognises packed rows
  and keeps attention inside each sequence (its mask functions build a document mask from the
  restarts; its flash-attention paths read them as varlen boundaries).
- *flattened* (padding-free): one row, every sequence back to back, ``position_ids`` restarting,
  no padding at all: the batch ``transformers.DataCollatorWithFlattening`` builds (a test holds
  the two equal), built here from device tensors without a round trip through Python lists.
- *padded to a multiple*: the same padded batch, its width rounded up to a multiple (64), so
  that a compiled step sees few widths instead of one per batch.

In every layout the label of a sequence's first token is -100 (a causal model predicts nothing
from the token before it: in a padded row that target is dropped by the shift; in a packed row
it would be the previous sequence's last token predicting this one's first), so the set of
(context, target) pairs, and with it the loss per real token, is the padded batch's.

:class:`Batches` is a step's data pipeline: where the step draws its padded batch, the real
tokens it holds, and the transforms levers put between the batches and the model. A step that
exposes one (``step.batches``, found through wrappers by :func:`batches_of`) can be packed by a
lever and unpacked by its undo; :func:`wrap_collator` puts one behind a Hugging Face Trainer's
``data_collator`` or a DataLoader's ``collate_fn``.

With known lengths (a workload's, the same every step) a layout is an index gather built once
and cached on the device, so a packed step reads nothing back from the GPU; without them, the
lengths are read from the mask once per batch (one sync).

Shapes: B rows, W padded width, N real tokens of the batch, R packed rows, L row length.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor

IGNORE_INDEX = -100
PAD_ID = 0
Batch = dict[str, Any]
Transform = Callable[[Batch], Batch]


@dataclass
class Batches:
    """A step's data pipeline: ``draw()`` gives the next padded batch, ``next()`` the batch the
    model gets (drawn, then each transform in order).

    ``lengths``: every batch ``draw()`` gives is right-padded with these real lengths, the same
    each step (the built-in workloads'); the layouts are then built once and read nothing from
    the device. None when they vary (a collator's), read from each batch's mask.
    ``transforms`` holds ``(lever id, transform)`` pairs.
    """

    draw: Callable[[], Batch] | None = None  # None for a collator's (it gets the batches)
    lengths: tuple[int, ...] | None = None
    transforms: list[tuple[str, Transform]] = field(default_factory=list)

    def next(self) -> Batch:
        if self.draw is None:
            raise TypeError("these batches come through a collator: they have no draw()")
        batch = self.draw()
        for _, transform in self.transforms:
            batch = transform(batch)
        return batch

    @property
    def layout(self) -> str:
        """"padded", or the id of the lever that changed the layout last."""
        return self.transforms[-1][0] if self.transforms else "padded"


def batches_of(step: Any) -> Batches | None:
    """The :class:`Batches` a step exposes as ``step.batches``, looked for through the
    ``__wrapped__`` chain of the wrappers levers put around a step; None when it has none."""
    seen = 0
    while step is not None and seen < 32:
        found = getattr(step, "batches", None)
        if isinstance(found, Batches):
            return found
        step, seen = getattr(step, "__wrapped__", None), seen + 1
    return None


def collator_attribute(host: Any) -> str | None:
    """Where ``host`` keeps the function that builds its batches: a Hugging Face Trainer's
    ``data_collator``, a DataLoader's ``collate_fn``; None for anything else."""
    if isinstance(host, torch.utils.data.DataLoader):
        return "collate_fn"
    if hasattr(host, "data_collator") and hasattr(host, "model"):
        return "data_collator"
    return None


def wrap_collator(host: Any) -> tuple[Batches, Callable[[], None]]:
    """Put a :class:`Batches` between ``host``'s collator and the model: its collator is
    replaced by one that runs the original, then the transforms levers add. Returns the batches
    and the undo that puts the original collator back (a Trainer builds its DataLoader from its
    collator when training starts: wrap it before ``trainer.train()``)."""
    name = collator_attribute(host)
    if name is None:
        raise TypeError(
            f"{type(host).__name__} has no collator levers can wrap: pass a Hugging Face "
            "Trainer (data_collator) or a torch DataLoader (collate_fn)"
        )
    original = getattr(host, name)
    if original is None:
        raise ValueError(f"{type(host).__name__}.{name} is None: there is no collator to wrap")
    found = Batches()
    if type(original).__name__ == "DataCollatorWithFlattening":  # already without padding
        found.transforms.append(("padding-free", lambda batch: batch))

    def collate(features: Any) -> Batch:
        batch = original(features)
        for _, transform in found.transforms:
            batch = transform(dict(batch))
        return batch

    collate.batches = found  # type: ignore[attr-defined]
    setattr(host, name, collate)

    def undo() -> None:
        setattr(host, name, original)

    return found, undo


# -- the padded batch ------------------------------------------------------------------------


def longtail_lengths(num: int, max_len: int, *, seed: int = 0) -> tuple[int, ...]:
    """``num`` sequence lengths from a long-tailed (log-normal) distribution with median
    ``max_len / 8`` and sigma 1, capped at ``max_len`` (at least 2 tokens): the quantiles at
    (i + 0.5) / num, in an order drawn from ``seed``. Quantiles rather than draws, so that the
    mean stays at most ``max_len / 4`` for every ``num`` (the log-normal's mean is
    ``e^0.5 / 8`` of ``max_len``, 0.21) and the longest is the distribution's tail."""
    normal = torch.distributions.Normal(0.0, 1.0)
    quantiles = torch.tensor([(i + 0.5) / num for i in range(num)], dtype=torch.float64)
    z = normal.icdf(quantiles)
    raw = torch.exp(math.log(max_len / 8) + z)
    lengths = [max(2, min(max_len, int(round(float(x))))) for x in raw]
    order = torch.randperm(num, generator=torch.Generator().manual_seed(seed)).tolist()
    return tuple(lengths[i] for i in order)


def varied_lengths(num: int, max_len: int, *, seed: int = 0, step: int = 0) -> tuple[int, ...]:
    """Step ``step``'s ``num`` sequence lengths, drawn afresh each step from
    :func:`longtail_lengths`' distribution (log-normal, median ``max_len / 8``, sigma 1, capped at
    ``max_len``, at least 2 tokens): one draw inside each of ``num`` equally likely strata (so a
    step holds short and long sequences alike, as longtail's quantiles do), in an order drawn
    too. The longest is the top stratum's draw, so the padded width changes from step to step
    and reaches ``max_len`` in about one step in six at ``num=8``. The mean length is at most
    ``max_len / 4`` in expectation (:func:`varied_mean_tokens`); one step's can be above it.

    Deterministic from ``(seed, step)`` and pure Python: the same sequence of batches for every
    variant built from one seed, and no tensor op (a memory prediction runs the step on fake
    tensors)."""
    rng = random.Random(f"varied-lengths:{seed}:{step}")
    lengths = [_longtail_length((i + rng.random()) / num, max_len) for i in range(num)]
    rng.shuffle(lengths)
    return tuple(lengths)


def varied_mean_tokens(num: int, max_len: int) -> int:
    """The expected real tokens of a :func:`varied_lengths` batch: ``num`` times the mean length
    of the distribution (the strata are equally likely), over 4096 of its quantiles."""
    grid = 4096
    mean = statistics.fmean(_longtail_length((j + 0.5) / grid, max_len) for j in range(grid))
    return round(num * mean)


def _longtail_length(quantile: float, max_len: int) -> int:
    """The length at ``quantile`` of the log-normal of median ``max_len / 8`` and sigma 1, capped
    at ``max_len``, at least 2 tokens."""
    quantile = min(max(quantile, 1e-12), 1 - 1e-12)  # inv_cdf takes the open interval
    raw = math.exp(math.log(max_len / 8) + statistics.NormalDist().inv_cdf(quantile))
    return max(2, min(max_len, int(round(raw))))


def draw_padded(
    lengths: Sequence[int], vocab_size: int, generator: torch.Generator, *, pad_id: int = PAD_ID
) -> Batch:
    """A right-padded batch of random tokens with the given real lengths (width the longest),
    drawn on the generator's device: ``input_ids``, ``attention_mask``, ``labels`` (the tokens,
    -100 on padding)."""
    device = generator.device
    width = max(lengths)
    ids_bw = torch.randint(
        0, vocab_size, (len(lengths), width), generator=generator, device=device
    )
    lengths_b = _to_device(list(lengths), torch.long, device, fake=_is_fake(ids_bw))
    mask_bw = torch.arange(width, device=device)[None] < lengths_b[:, None]
    ids_bw = ids_bw.masked_fill(~mask_bw, pad_id)
    return {
        "input_ids": ids_bw,
        "attention_mask": mask_bw.long(),
        "labels": ids_bw.masked_fill(~mask_bw, IGNORE_INDEX),
    }


def padded(sequences: Sequence[torch.Tensor], *, pad_id: int = PAD_ID) -> Batch:
    """Right-padded batch of 1-D token tensors: ``input_ids``, ``attention_mask``, ``labels``
    (the tokens, -100 on padding), padded to the longest."""
    width = max(int(s.numel()) for s in sequences)
    device = sequences[0].device
    ids_bw = torch.full((len(sequences), width), pad_id, dtype=torch.long, device=device)
    mask_bw = torch.zeros((len(sequences), width), dtype=torch.long, device=device)
    for row, seq in enumerate(sequences):
        ids_bw[row, : seq.numel()] = seq
        mask_bw[row, : seq.numel()] = 1
    labels_bw = ids_bw.masked_fill(mask_bw == 0, IGNORE_INDEX)
    return {"input_ids": ids_bw, "attention_mask": mask_bw, "labels": labels_bw}


@dataclass(frozen=True)
class Layout:
    """Where each token of a layout comes from, as device tensors: ``index`` into the padded
    batch flattened with one pad token appended (``B * W`` is that pad), the ``position_ids``,
    and ``no_target`` (True where the label becomes -100: each sequence's first token, filler)."""

    index: torch.Tensor
    position_ids: torch.Tensor
    no_target: torch.Tensor
    shape: tuple[int, int]


_LAYOUTS: dict[tuple, Layout] = {}
_MAX_LAYOUTS = 256


def _is_fake(tensor: torch.Tensor) -> bool:
    return isinstance(tensor, FakeTensor) or tensor.device.type == "meta"


def _to_device(
    values: list[Any], dtype: torch.dtype, device: torch.device, *, fake: bool = False
) -> torch.Tensor:
    host = torch.tensor(values, dtype=dtype)
    if device.type == "cuda" and not fake:  # pinned and asynchronous: no wait for the GPU
        return host.pin_memory().to(device, non_blocking=True)
    return host.to(device)


def _where(batch: Batch, lengths: Sequence[int] | None) -> tuple[list[int], list[int], int]:
    """(lengths, first real column per row, width) of a padded batch. Given ``lengths`` the
    batch is right-padded with them (no device read); else both are read from the mask."""
    ids_bw = batch["input_ids"]
    width = int(ids_bw.shape[1])
    if lengths is not None:
        return [int(n) for n in lengths], [0] * len(lengths), width
    mask_bw = batch.get("attention_mask")
    if mask_bw is None:
        raise ValueError(
            "a padded batch needs its attention_mask (1 on real tokens) to find the sequences; "
            "this one has none (already packed or flattened?)"
        )
    mask_bw = mask_bw.bool()
    read = torch.stack([mask_bw.sum(1), mask_bw.int().argmax(1)]).tolist()  # sync point: once
    return [int(n) for n in read[0]], [int(f) for f in read[1]], width


def _layout(
    kind: str, lengths: list[int], first: list[int], width: int, row_len: int | None,
    like: torch.Tensor,
) -> Layout:
    """The layout's device tensors, cached by what decides them; never cached from fake or meta
    tensors (a memory prediction), whose tensors a real step must not get."""
    device, fake = like.device, _is_fake(like)
    key = (kind, tuple(lengths), tuple(first), width, row_len, str(device))
    if key in _LAYOUTS and not fake:
        return _LAYOUTS[key]
    pad = len(lengths) * width  # the pad token appended after the flattened batch
    seqs = [i for i, n in enumerate(lengths) if n > 0]
    if kind == "flatten":
        rows, row_len = [seqs], sum(lengths)
    else:
        row_len = width if row_len is None else row_len
        rows = first_fit_decreasing(lengths, row_len)
    index: list[int] = []
    positions: list[int] = []
    no_target: list[bool] = []
    for row in rows:
        used = 0
        for s in row:
            n, at = lengths[s], s * width + first[s]
            index.extend(range(at, at + n))
            positions.extend(range(n))
            no_target.extend([True] + [False] * (n - 1))
            used += n
        rest = row_len - used
        index.extend([pad] * rest)
        positions.extend(range(rest))  # filler is its own document, never a target
        no_target.extend([True] * rest)
    layout = Layout(
        index=_to_device(index, torch.long, device, fake=fake),
        position_ids=_to_device(positions, torch.long, device, fake=fake).view(len(rows), row_len),
        no_target=_to_device(no_target, torch.bool, device, fake=fake).view(len(rows), row_len),
        shape=(len(rows), row_len),
    )
    if fake:
        return layout
    if len(_LAYOUTS) >= _MAX_LAYOUTS:
        _LAYOUTS.pop(next(iter(_LAYOUTS)))
    _LAYOUTS[key] = layout
    return layout


def _lay_out(batch: Batch, layout: Layout, pad_id: int) -> Batch:
    ids_bw = batch["input_ids"]
    labels_bw = batch.get("labels")
    if labels_bw is None:
        labels_bw = ids_bw
    ids_ext = torch.cat([ids_bw.reshape(-1), ids_bw.new_full((1,), pad_id)])
    labels_ext = torch.cat([labels_bw.reshape(-1), labels_bw.new_full((1,), IGNORE_INDEX)])
    return {
        "input_ids": ids_ext[layout.index].view(layout.shape),
        "labels": labels_ext[layout.index].view(layout.shape).masked_fill(
            layout.no_target, IGNORE_INDEX
        ),
        "position_ids": layout.position_ids,
    }


# -- flattened (padding-free) ----------------------------------------------------------------


def flatten(
    batch: Batch, *, lengths: Sequence[int] | None = None, pad_id: int = PAD_ID
) -> Batch:
    """One row of every sequence back to back: ``input_ids`` [1, N], ``labels`` [1, N] (-100 at
    each sequence's first token), ``position_ids`` [1, N] restarting at 0; no attention mask.

    ``lengths``: the batch is right-padded with these real lengths (a workload's, the same every
    step): nothing is read from the device, and the layout is built once."""
    lengths_, first, width = _where(batch, lengths)
    layout = _layout("flatten", lengths_, first, width, None, batch["input_ids"])
    return _lay_out(batch, layout, pad_id)


# -- packed ----------------------------------------------------------------------------------


def first_fit_decreasing(lengths: Sequence[int], row_len: int) -> list[list[int]]:
    """Sequence indices per row: each sequence, longest first, into the first row it fits."""
    if lengths and max(lengths) > row_len:
        raise ValueError(
            f"a sequence of {max(lengths)} tokens does not fit a packed row of {row_len}: raise "
            "row_len (packing never splits a sequence)"
        )
    rows: list[list[int]] = []
    free: list[int] = []
    for index in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        n = lengths[index]
        if n == 0:
            continue
        for r, room in enumerate(free):
            if n <= room:
                rows[r].append(index)
                free[r] -= n
                break
        else:
            rows.append([index])
            free.append(row_len - n)
    return rows


def pack(
    batch: Batch,
    row_len: int | None = None,
    *,
    lengths: Sequence[int] | None = None,
    pad_id: int = PAD_ID,
) -> Batch:
    """The sequences first-fit-decreasing into rows of ``row_len`` (default the batch's padded
    width, so no row is longer than a padded one): ``input_ids``, ``labels``, ``position_ids``
    [R, L]. The filler at a row's end is its own run of positions from 0 and has labels -100;
    there is no attention mask (transformers finds the documents from the position restarts).
    ``lengths`` as for :func:`flatten`."""
    lengths_, first, width = _where(batch, lengths)
    layout = _layout("pack", lengths_, first, width, row_len, batch["input_ids"])
    return _lay_out(batch, layout, pad_id)


# -- padded to a multiple --------------------------------------------------------------------


def pad_to_multiple(batch: Batch, multiple: int = 64, *, pad_id: int = PAD_ID) -> Batch:
    """The padded batch with its width rounded up to a multiple of ``multiple``: more padding
    (mask 0, labels -100) on the side the batch is padded on (right unless its last column is
    all real and its first is not)."""
    ids_bw = batch["input_ids"]
    width = int(ids_bw.shape[1])
    extra = math.ceil(width / multiple) * multiple - width
    if extra == 0:
        return batch
    mask_bw = batch.get("attention_mask")
    if mask_bw is None:
        mask_bw = torch.ones_like(ids_bw)
    left = bool(mask_bw[:, -1].all() and not mask_bw[:, 0].all())  # sync point: once per batch
    side = (extra, 0) if left else (0, extra)
    pad = torch.nn.functional.pad
    out = dict(batch)
    out["input_ids"] = pad(ids_bw, side, value=pad_id)
    out["attention_mask"] = pad(mask_bw, side, value=0)
    if batch.get("labels") is not None:
        out["labels"] = pad(batch["labels"], side, value=IGNORE_INDEX)
    return out
