"""What-ifs: the predicted peaks with a change the user has not made yet, without touching code.

- ``activation-checkpointing``: every block (each module of an ``nn.ModuleList`` whose modules
  share a class, e.g. ``blocks.0`` .. ``blocks.31``) runs under non-reentrant
  ``torch.utils.checkpoint``, wrapped as the lever ``ac-full`` wraps them (its KV cache off and
  its cache arguments dropped). Predicted by building the workload again, wrapping the blocks,
  and running the steps: a full re-prediction.
- ``bf16-optimizer-states``: Adam's moments kept in bfloat16 instead of float32, what the lever
  ``adamw-bf16-state`` does. Predicted on the recorded trace: each float32 moment (an optimizer
  state tensor that is not a scalar step counter) takes half its bytes; the trace is replayed
  through the allocator model. ``delta_state_bytes`` is the state's change (the bytes the lever
  frees, negative). The optimizer-phase temporaries are left as recorded: the lever's update is
  torchao's, one parameter at a time in fp32, so a fused baseline's (none) are the lever's, and
  a foreach baseline's (as large as the state) bound the lever's from above.
- ``8bit-optimizer-states``: Adam's moments quantized to 8 bits, what the lever ``adamw-8bit``
  (torchao's AdamW8bit) does. On the trace: each float32 moment of at least 4096 values, a
  multiple of 256, takes one byte per value, a float32 scale per 256 values and torchao's
  256-entry float32 quantization map (one allocation here, three there); smaller moments stay
  float32, as torchao keeps them. Temporaries as for bf16.
- ``valid-rows-loss``: the loss computed over the rows that have a target only (ignored rows,
  e.g. padding, gathered out before the LM head). Predicted on the trace: activations and
  temporaries with a dimension equal to the loss's class count (the logits, their float32
  copies, log-softmax, their gradients) shrink by the share of rows that have a target, which
  the step's target values give (see :mod:`levers.memory.shadow`).
- ``sdpa-attention``: eager attention (matmul, softmax, matmul) switched to
  ``F.scaled_dot_product_attention``, where the model has a switch for it: a Hugging Face
  model's attention implementation (``set_attn_implementation("sdpa")``, or
  ``config._attn_implementation``) and timm's ``fused_attn`` attribute. Predicted by building the
  workload again, switching, and running the steps: a full re-prediction, skipped when the
  model has no such switch. What ATTN002 says the fix frees is this what-if's drop of the
  allocated peak.
"""

from __future__ import annotations

import dataclasses

import torch

from levers.adam_state import (  # noqa: F401 - INT8_* and int8_moment_nbytes re-exported
    BF16_STATE_LEVER,
    INT8_BLOCK,
    INT8_MAP_BYTES,
    INT8_MIN_NUMEL,
    INT8_STATE_LEVER,
    int8_moment_nbytes,
)
from levers.block_checkpoint import caching_configs, wrap_blocks
from levers.blocks import repeated_blocks
from levers.hardware import GpuSpec
from levers.memory.plan import WhatIf
from levers.memory.prediction import Prediction, Source, run_prediction
from levers.memory.replay import replay
from levers.memory.trace import Allocation, Trace
from levers.units import format_bytes
from levers.workload import Workload


def all_whatifs(
    source: Source, gpu: GpuSpec, base: Prediction, *, num_steps: int
) -> tuple[WhatIf, ...]:
    return (
        checkpointing(source, gpu, base, num_steps=num_steps),
        bf16_optimizer_states(base),
        int8_optimizer_states(base),
        valid_rows_loss(base),
        sdpa_attention(source, gpu, base, num_steps=num_steps),
    )


def _delta(
    name: str,
    description: str,
    method: str,
    base: Prediction,
    allocated: int,
    reserved: int,
    note: str = "",
) -> WhatIf:
    return WhatIf(
        name=name,
        description=description,
        method=method,
        applicable=True,
        peak_allocated_bytes=allocated,
        peak_reserved_bytes=reserved,
        delta_allocated_bytes=allocated - base.replay.peak_allocated_bytes,
        delta_reserved_bytes=reserved - base.replay.peak_reserved_bytes,
        note=note,
    )


def checkpoint_blocks(workload: Workload) -> int:
    """Run each block's forward under non-reentrant checkpointing as the lever ``ac-full`` does
    (:func:`levers.block_checkpoint.wrap_blocks`: the KV cache off, as Hugging Face's own
    gradient checkpointing turns it off, the cache arguments dropped for each call, so that the
    recompute does not append its keys and values a second time); returns how many blocks."""
    blocks = repeated_blocks(workload.model)
    if blocks:
        wrap_blocks(workload.model, blocks)
    return len(blocks)


def checkpointing(source: Source, gpu: GpuSpec, base: Prediction, *, num_steps: int) -> WhatIf:
    name = "activation-checkpointing"
    description = "every block under torch.utils.checkpoint (non-reentrant)"
    counted: list[int] = []
    caches_off: list[int] = []

    def transform(workload: Workload) -> None:
        caches_off.append(len(caching_configs(workload.model)))
        counted.append(checkpoint_blocks(workload))

    try:
        prediction = run_prediction(source, gpu, num_steps=num_steps, transform=transform)
    except Exception as exc:  # a what-if must not break the plan it annotates
        return WhatIf(name, description, "re-prediction", False, note=f"failed: {exc}"[:200])
    if not counted or counted[0] == 0:
        return WhatIf(
            name,
            description,
            "re-prediction",
            False,
            note="no repeated blocks (an nn.ModuleList of one module class) to wrap",
        )
    return _delta(
        name,
        description,
        f"re-prediction with {counted[0]} blocks wrapped"
        + (" (use_cache off, as Hugging Face's gradient checkpointing does)" if caches_off[0] else ""),
        base,
        prediction.replay.peak_allocated_bytes,
        prediction.replay.peak_reserved_bytes,
    )


def float32_moments(trace: Trace) -> list[tuple[int, Allocation]]:
    """(handle, allocation) of each float32 optimizer state tensor that is not a scalar (the
    moments; a fused Adam's step counters are scalars)."""
    return [
        (handle, allocation)
        for handle, allocation in enumerate(trace.allocations, start=1)
        if allocation.category == "optimizer"
        and allocation.dtype == "float32"
        and allocation.shape != ()
    ]


def bf16_optimizer_sizes(trace: Trace) -> dict[int, int]:
    """New byte counts for the moments that bf16 optimizer state halves."""
    return {handle: allocation.nbytes // 2 for handle, allocation in float32_moments(trace)}


def int8_optimizer_sizes(trace: Trace) -> dict[int, int]:
    """New byte counts for the moments that torchao's 8-bit state quantizes."""
    sizes = {}
    for handle, allocation in float32_moments(trace):
        nbytes = int8_moment_nbytes(allocation.shape)
        if nbytes is not None:
            sizes[handle] = nbytes
    return sizes


def _state_whatif(
    base: Prediction, name: str, description: str, lever: str, sizes: dict[int, int], how: str
) -> WhatIf:
    if not sizes:
        note = "no float32 optimizer moments in the step"
        if float32_moments(base.trace):  # there are some: none that torchao quantizes
            note += f" of {INT8_MIN_NUMEL} values or more, in multiples of {INT8_BLOCK}"
        return WhatIf(name, description, "trace transform", False, note=note, lever=lever)
    replayed = replay(base.trace, sizes=sizes)
    before = sum(base.trace.allocations[handle - 1].nbytes for handle in sizes)
    state_delta = sum(sizes.values()) - before
    whatif = _delta(
        name,
        description,
        f"trace transform: {how} (lever {lever}; state {format_bytes(state_delta)})",
        base,
        replayed.peak_allocated_bytes,
        replayed.peak_reserved_bytes,
    )
    return dataclasses.replace(whatif, lever=lever, delta_state_bytes=state_delta)


def bf16_optimizer_states(base: Prediction) -> WhatIf:
    return _state_whatif(
        base,
        "bf16-optimizer-states",
        "Adam's moments in bfloat16 instead of float32",
        BF16_STATE_LEVER,
        bf16_optimizer_sizes(base.trace),
        "float32 moments halved",
    )


def int8_optimizer_states(base: Prediction) -> WhatIf:
    return _state_whatif(
        base,
        "8bit-optimizer-states",
        "Adam's moments quantized to 8 bits, block-wise (torchao AdamW8bit)",
        INT8_STATE_LEVER,
        int8_optimizer_sizes(base.trace),
        "float32 moments of 4096+ values to 8 bits",
    )


def valid_row_fraction(trace: Trace) -> float | None:
    """The share of loss rows with a target, over every cross-entropy call, if known."""
    rows = valid = 0
    for call in trace.losses:
        if call.num_valid_rows is None:
            return None
        rows += call.num_rows
        valid += call.num_valid_rows
    return valid / rows if rows else None


def valid_rows_sizes(trace: Trace, fraction: float) -> dict[int, int]:
    classes = {call.num_classes for call in trace.losses}
    sizes = {}
    for handle, allocation in enumerate(trace.allocations, start=1):
        if allocation.category not in ("activations", "temporaries") or allocation.step < 0:
            continue
        if any(size in classes for size in allocation.shape):
            sizes[handle] = int(allocation.nbytes * fraction)
    return sizes


def valid_rows_loss(base: Prediction) -> WhatIf:
    name = "valid-rows-loss"
    description = "the loss computed over rows with a target only"
    if not base.trace.losses:
        return WhatIf(
            name, description, "trace transform", False, note="the step calls no F.cross_entropy"
        )
    fraction = valid_row_fraction(base.trace)
    if fraction is None:
        return WhatIf(
            name,
            description,
            "trace transform",
            False,
            note="the targets' values are not known (computed from activations)",
        )
    if fraction >= 1.0:
        return WhatIf(
            name, description, "trace transform", False, note="every row already has a target"
        )
    replayed = replay(base.trace, sizes=valid_rows_sizes(base.trace, fraction))
    return _delta(
        name,
        description,
        f"trace transform: class-wide activations scaled to the {fraction:.0%} of rows with a target",
        base,
        replayed.peak_allocated_bytes,
        replayed.peak_reserved_bytes,
    )


SDPA_WHATIF = "sdpa-attention"
EAGER, SDPA = "eager", "sdpa"


class _NothingToSwitch(Exception):
    """Raised by a what-if's transform to stop a re-prediction that would change nothing."""


def switch_to_sdpa(model: torch.nn.Module) -> list[str]:
    """Switch the model's eager attention to SDPA where it has a switch; returns what changed.

    A Hugging Face model reads its attention implementation from its config at every forward
    (``set_attn_implementation`` updates the config of each sub-model); timm's attention
    modules read ``fused_attn``.
    """
    switched = []
    for name, module in model.named_modules():
        config = getattr(module, "config", None)
        if getattr(config, "_attn_implementation", None) == EAGER:
            setter = getattr(module, "set_attn_implementation", None)
            if callable(setter):
                setter(SDPA)
            if config._attn_implementation == EAGER:
                config._attn_implementation = SDPA
            switched.append(f"{name or '<model>'}.config._attn_implementation")
        if getattr(module, "fused_attn", None) is False:
            module.fused_attn = True
            switched.append(f"{name or '<model>'}.fused_attn")
    return switched


def sdpa_attention(source: Source, gpu: GpuSpec, base: Prediction, *, num_steps: int) -> WhatIf:
    name = SDPA_WHATIF
    description = "eager attention switched to F.scaled_dot_product_attention"
    switched: list[str] = []

    def transform(workload: Workload) -> None:
        switched.extend(switch_to_sdpa(workload.model))
        if not switched:
            raise _NothingToSwitch

    try:
        prediction = run_prediction(source, gpu, num_steps=num_steps, transform=transform)
    except _NothingToSwitch:
        return WhatIf(
            name,
            description,
            "re-prediction",
            False,
            note="no eager attention with a switch to SDPA (a Hugging Face model's "
            "attn_implementation, timm's fused_attn)",
        )
    except Exception as exc:  # a what-if must not break the plan it annotates
        return WhatIf(name, description, "re-prediction", False, note=f"failed: {exc}"[:200])
    configs = sum(1 for s in switched if s.endswith("_attn_implementation"))
    modules = len(switched) - configs
    how = []
    if configs:
        how.append("attn_implementation='sdpa'")
    if modules:
        how.append(f"fused_attn=True on {modules} modules")
    return _delta(
        name,
        description,
        "re-prediction with " + " and ".join(how),
        base,
        prediction.replay.peak_allocated_bytes,
        prediction.replay.peak_reserved_bytes,
    )
