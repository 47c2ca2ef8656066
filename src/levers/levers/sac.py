"""Selective activation checkpointing: what the ``ac-selective`` and ``ac-budget`` policies share.

A policy is a function ``policy(ctx, func, *args, **kwargs) -> CheckpointPolicy`` called by
``torch.utils.checkpoint`` for every aten op a checkpointed block runs, in forward and again in
the recompute; ``MUST_SAVE`` keeps the op's output for backward, ``PREFER_RECOMPUTE`` runs it
again. Every checkpoint call gets a fresh policy (:func:`contexts`), so counters kept in it (the
n-th matmul of the block) count the same ops in the forward and in its recompute.

Ops are keyed by name and occurrence in the block (``("aten.mm.default", 3)``: the block's fourth
``mm``; every attention backend's op is named ``attention``), which is the same for every call of a block of one class and does not depend on
tensor identities: a plan keyed this way is deterministic.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

aten = torch.ops.aten

MATMULS = frozenset({aten.mm.default, aten.addmm.default, aten.bmm.default})


def _attention_ops() -> frozenset:
    names = (
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
    )
    return frozenset(getattr(aten, name).default for name in names if hasattr(aten, name))


ATTENTION = _attention_ops()
ATTENTION_KEY = "attention"  # one key name for every attention backend's op
_ATTENTION_NAMES = frozenset(str(op) for op in ATTENTION)

Policy = Callable[..., CheckpointPolicy]


def op_name(func: Any) -> str:
    return str(func)  # "aten.mm.default", the spelling the memory trace and the capture use


def key_name(name: str) -> str:
    """The name an op is keyed by: its own, or ``attention`` for any attention backend (the one
    that runs may differ between a prediction and the GPU)."""
    return ATTENTION_KEY if name in _ATTENTION_NAMES else name


def matmul_flops(func: Any, args: tuple) -> int:
    """FLOPs of one mm / addmm / bmm call from its operand shapes."""
    if func is aten.addmm.default:
        args = args[1:]
    a, b = args[0].shape, args[1].shape
    if func is aten.bmm.default:
        return 2 * a[0] * a[1] * a[2] * b[2]
    return 2 * a[0] * a[1] * b[1]


def contexts(make_policy: Callable[[], Policy]) -> Callable[[], tuple[Any, Any]]:
    """A ``context_fn`` for ``checkpoint``: a fresh policy (fresh counters) per call."""

    def context_fn() -> tuple[Any, Any]:
        return create_selective_checkpoint_contexts(make_policy())

    return context_fn


def keyed_policy(save: frozenset[tuple[str, int]]) -> Callable[[], Policy]:
    """A policy that saves the ops whose (name, occurrence) key is in ``save``."""

    def make() -> Policy:
        counts: dict[tuple[bool, str], int] = defaultdict(int)

        def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
            name = key_name(op_name(func))
            slot = (bool(ctx.is_recompute), name)
            occurrence = counts[slot]
            counts[slot] += 1
            if (name, occurrence) in save:
                return CheckpointPolicy.MUST_SAVE
            return CheckpointPolicy.PREFER_RECOMPUTE

        return policy

    return make
