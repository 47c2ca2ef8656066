"""``adamw-8bit``: Adam/AdamW with its two moments quantized to 8 bits, block-wise (torchao).

torchao's ``AdamW8bit`` (``Adam8bit`` for Adam's L2 weight decay): each moment of a parameter
with at least 4096 elements, a multiple of the block size (256), is kept as uint8 codes into a
dynamic-exponent quantization map (bitsandbytes' map, signed for ``exp_avg``, unsigned for
``exp_avg_sq``) with one fp32 scale per block of 256 (Dettmers et al., "8-bit Optimizers via
Block-wise Quantization", 2022, https://arxiv.org/abs/2110.02861). A moment is about 1 + 4/256
bytes per element (plus the 1 KiB map per tensor) against fp32's 4: about a quarter of the
state. Smaller parameters (norm weights, biases) keep fp32 moments, as bitsandbytes does. The
update dequantizes, runs in fp32 and requantizes, one compiled kernel per parameter
(``torch.compile(fullgraph=True)``).

The optimizer the step already holds is kept, and torchao's optimizer is put behind it
(:mod:`levers.levers._optimizer_state`: its ``state`` and ``step`` swapped in place, its
hyper-parameters read at each step, the undo puts back the very state it had).

Runs on a CPU with torch 2.13 and torchao 0.18 (inductor compiles its update there too), so the
CPU tests train with it; its saving is device memory, read on a GPU.

Fix safety: changes numerics (8-bit moments). Tolerance checked against fp32 AdamW over three
steps of the tiny llama, in fp32 on a CPU (tests/levers/test_optimizer_state.py): 1e-3 relative
on the losses (measured: 2.6e-7) and 0.35 on each parameter's update (measured: 0.25, the
quantization error of young moments). That is a smoke check of the wiring, not the proof: its
proof is the paired held-out loss of ``levers ab`` (the quality read) over at least 500 steps
(bench/optimizer_state.py runs it on the built-in llama).
"""

from __future__ import annotations

import importlib
from typing import Callable

import torch

from levers.optional import import_quietly
from levers.levers import register
from levers.levers._optimizer_state import (
    inner_groups,
    is_adamw,
    reason,
    slower_here_of,
    swap,
)
from levers.levers.lever import Lever, Target
from levers.vocab import CHANGES_NUMERICS

ID = "adamw-8bit"
TOLERANCE = 1e-3  # on the losses; the test holds each parameter's update to UPDATE_RTOL
UPDATE_RTOL = 0.35
BLOCK_SIZE = 256  # torchao's default for AdamW8bit
MIN_NUMEL = 4096  # torchao (after bitsandbytes) quantizes tensors of at least this many values
NEEDS = ("AdamW8bit", "Adam8bit")
KNOWN_PROBLEMS = (
    "changes numerics: the held-out loss over >= 500 steps (levers ab's quality read) is its "
    "proof; parameters under 4096 elements keep fp32 moments; torchao compiles one update per "
    "parameter shape (a first step of seconds to minutes, on a CPU too)"
)


def quantized(p: torch.Tensor) -> bool:
    """Whether torchao keeps this parameter's moments in 8 bits (``_AdamBase._new_buffer``)."""
    return p.numel() >= MIN_NUMEL and p.numel() % BLOCK_SIZE == 0


def applies(target: Target) -> str | None:
    why = reason(target.optimizer, NEEDS)
    if why is not None:
        return why
    params = [p for g in target.optimizer.param_groups for p in g["params"]]
    if not any(quantized(p) for p in params):
        return (
            f"no parameter has {MIN_NUMEL} elements or more in a multiple of {BLOCK_SIZE}, the "
            "ones torchao quantizes (smaller ones keep fp32 moments): nothing would shrink"
        )
    return None


def build(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """torchao's 8-bit Adam(W) over ``optimizer``'s parameters, with its hyper-parameters."""
    adam = import_quietly("torchao.optim.adam")
    cls = adam.AdamW8bit if is_adamw(optimizer) else adam.Adam8bit
    return cls(inner_groups(optimizer), block_size=BLOCK_SIZE)


def patch(target: Target) -> Callable[[], None]:
    assert target.optimizer is not None
    return swap(target.optimizer, build(target.optimizer), ID)


LEVER = register(
    Lever(
        id=ID,
        title="Keep Adam/AdamW's two moments in 8 bits, block-wise quantized (torchao AdamW8bit)",
        safety=CHANGES_NUMERICS,
        tolerance=TOLERANCE,
        fixes=("MEM004",),
        applies=applies,
        patch=patch,
        slower_here=slower_here_of(ID),
        # its saving is device memory, which a CPU run does not read (levers tune leaves it out
        # there); it runs on a CPU, torchao compiling its update there too
        needs_gpu=True,
        known_problems=KNOWN_PROBLEMS,
    )
)
