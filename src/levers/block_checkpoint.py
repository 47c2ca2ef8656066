"""Wrapping a model's repeated blocks in non-reentrant ``torch.utils.checkpoint``, and turning a
Hugging Face model's KV cache off while a lever is on: the code the activation-checkpointing
levers (:mod:`levers.levers.checkpointing`) and levers memory's checkpointing what-if share, so
that the what-if predicts the run the lever makes.

Each chosen block's ``forward`` is replaced, on the instance, by one that runs the original
under non-reentrant checkpointing, with an optional ``context_fn`` (a selective policy). Module
hooks stay outside the checkpoint, as Hugging Face's own gradient checkpointing keeps them, so
they do not run twice when backward recomputes the block. Keyword arguments (attention masks,
position embeddings) pass through unchanged, but for the KV cache's: while a block is
checkpointed no cache is built or read (``use_cache=False`` and the cache arguments set to
``None`` for the call, ``config.use_cache`` set to ``False`` while the lever is applied), since
the recompute would append to the cache a second time.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from levers.blocks import Block

Undo = Callable[[], None]
ContextFn = Callable[[], tuple[Any, Any]]

# the names Hugging Face layers give their KV cache argument
_CACHE_KWARGS = ("past_key_values", "past_key_value", "cache", "layer_past")


def caching_configs(model: torch.nn.Module) -> list[object]:
    """The distinct model configs reachable from ``model`` that keep ``use_cache=True`` (a T5's
    decoder holds a copy of its own, so every module's ``config`` is looked at)."""
    found: dict[int, object] = {}
    for module in model.modules():
        config = getattr(module, "config", None)
        if config is not None and getattr(config, "use_cache", None) is True:
            found.setdefault(id(config), config)
    return list(found.values())


def training_cache_off(model: torch.nn.Module) -> Callable[[], None]:
    """Turn off every reachable config's KV cache while a lever is on; returns the undo.

    A config as shipped keeps ``use_cache=True`` (the generation default), and transformers then
    builds a cache in every forward, training included: the compile levers would recompile per
    block (:mod:`levers.levers._compile_setup`), the data levers' packed documents would see each
    other (transformers reads restarting position ids only without a cache), and checkpointing
    would keep a cache HF's own gradient checkpointing turns off. A training step never reads
    it."""
    configs = caching_configs(model)
    for config in configs:
        config.use_cache = False

    def undo() -> None:
        for config in configs:
            config.use_cache = True

    return undo


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
