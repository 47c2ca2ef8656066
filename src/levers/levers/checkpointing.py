"""Wrapping a model's repeated blocks in ``torch.utils.checkpoint``: the layer the three
activation-checkpointing levers (``ac-full``, ``ac-selective``, ``ac-budget``) share.

Each chosen block's ``forward`` is replaced, on the instance, by one that runs the original
under non-reentrant checkpointing, with an optional ``context_fn`` (a selective policy). Module
hooks stay outside the checkpoint, as Hugging Face's own gradient checkpointing keeps them, so
they do not run twice when backward recomputes the block. Keyword arguments (attention masks,
position embeddings) pass through unchanged.

Hugging Face models are handled as their own checkpointing does: while a block is checkpointed
no KV cache is built or read (``use_cache=False`` and the cache arguments set to ``None`` for
the call, ``config.use_cache`` set to ``False`` while the lever is applied), since the recompute
would append to the cache a second time.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from levers.blocks import Block, repeated_blocks
from levers.levers._find import training_cache_off

Undo = Callable[[], None]
ContextFn = Callable[[], tuple[Any, Any]]

# the names Hugging Face layers give their KV cache argument
_CACHE_KWARGS = ("past_key_values", "past_key_value", "cache", "layer_past")


def blocks_or_reason(model: torch.nn.Module) -> tuple[list[Block], str | None]:
    """The repeated blocks of ``model``, or why checkpointing has nothing to wrap."""
    blocks = repeated_blocks(model)
    if not blocks:
        return [], (
            "the model has no repeated blocks (an nn.ModuleList or nn.Sequential of at least two "
            "modules of one class) to checkpoint"
        )
    wrapped = [b.path for b in blocks if "forward" in vars(b.module)]
    if wrapped:
        return blocks, (
            f"block {wrapped[0]} already has its own forward (another lever or checkpointing is "
            "applied); undo it first"
        )
    return blocks, None


def _without_cache(kwargs: dict[str, Any]) -> dict[str, Any]:
    if "use_cache" in kwargs and kwargs["use_cache"]:
        kwargs = {**kwargs, "use_cache": False}
    for name in _CACHE_KWARGS:
        if kwargs.get(name) is not None:
            kwargs = {**kwargs, name: None}
    return kwargs


def _checkpointed(
    original: Callable[..., Any], context_fn: Callable[[], ContextFn | None]
) -> Callable[..., Any]:
    # made once, here, not per call: inside a compiled block dynamo takes a context_fn only as a
    # function that exists before it traces (a closure made while tracing is refused:
    # "checkpoint not implemented for NestedUserFunctionVariable context_fn"); the context_fn
    # itself makes a fresh policy per call
    make_contexts = context_fn()
    extra = {} if make_contexts is None else {"context_fn": make_contexts}

    @functools.wraps(original)
    def forward(*args: Any, **kwargs: Any) -> Any:
        # Without gradients there is no backward to replay the block: run it as is.
        if not torch.is_grad_enabled():
            return original(*args, **kwargs)
        kwargs = _without_cache(kwargs)
        return checkpoint(original, *args, use_reentrant=False, **extra, **kwargs)

    return forward


def wrap_blocks(
    model: torch.nn.Module,
    blocks: Sequence[Block],
    context_fn_for: Callable[[int, Block], Callable[[], ContextFn | None]] | None = None,
) -> Undo:
    """Checkpoint each of ``blocks``; ``context_fn_for(position, block)`` gives, per block, a
    function returning the block's ``context_fn`` (None: checkpoint the whole block), called
    once when the block is wrapped; the ``context_fn`` makes a fresh policy for every call.

    Returns the undo, which restores each block's forward and the config's ``use_cache``.
    """
    changed: list[torch.nn.Module] = []
    for position, block in enumerate(blocks):
        module = block.module
        assert "forward" not in vars(module), f"{block.path} is already wrapped"
        per_call = context_fn_for(position, block) if context_fn_for else (lambda: None)
        module.forward = _checkpointed(module.forward, per_call)
        changed.append(module)
    restore_cache = training_cache_off(model)

    def undo() -> None:
        for module in changed:
            vars(module).pop("forward", None)
        restore_cache()

    return undo
