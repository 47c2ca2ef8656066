"""The bytes of Adam's two moments in the forms the optimizer-state levers keep them.

One definition for the two readers: ``levers memory``'s what-ifs (``bf16-optimizer-states``,
``8bit-optimizer-states``, on the recorded trace) and rule MEM004 (on the capture's record of the
optimizer state). Torch-free, so that either can import it.

- ``adamw-bf16-state``: a float32 moment in bfloat16 takes half its bytes.
- ``adamw-8bit`` (torchao's AdamW8bit): a float32 moment of at least 4096 values, a multiple of
  256, takes one byte a value, a float32 scale a block of 256 and torchao's 256-entry float32
  quantization map; smaller moments stay float32, as torchao keeps them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

# the levers that keep the moments smaller
BF16_STATE_LEVER, INT8_STATE_LEVER = "adamw-bf16-state", "adamw-8bit"
# torchao's AdamW8bit: moments of at least this many values, in blocks of this many, one byte a
# value, a float32 scale a block and a 256-entry float32 map a tensor
INT8_MIN_NUMEL, INT8_BLOCK, INT8_MAP_BYTES = 4096, 256, 256 * 4
FLOAT32_BYTES = 4


def bf16_moment_nbytes(shape: tuple[int, ...]) -> int:
    """The bytes of one float32 moment kept in bfloat16."""
    return math.prod(shape) * FLOAT32_BYTES // 2


def int8_moment_nbytes(shape: tuple[int, ...]) -> int | None:
    """The bytes of one moment in torchao's 8-bit state, or None where torchao keeps it fp32."""
    numel = math.prod(shape)
    if numel < INT8_MIN_NUMEL or numel % INT8_BLOCK:
        return None
    return numel + 4 * (numel // INT8_BLOCK) + INT8_MAP_BYTES


def bf16_freed_bytes(numels: Iterable[int]) -> int:
    """What bf16 moments free, over float32 moments of these sizes."""
    return sum(n * FLOAT32_BYTES - bf16_moment_nbytes((n,)) for n in numels)


def int8_freed_bytes(numels: Iterable[int]) -> int:
    """What torchao's 8-bit moments free, over float32 moments of these sizes."""
    freed = 0
    for n in numels:
        nbytes = int8_moment_nbytes((n,))
        if nbytes is not None:
            freed += n * FLOAT32_BYTES - nbytes
    return freed
