"""Aligning the timed pass's op events with the content pass's op records, and giving each
kernel of the timed pass to a content op.

The two passes run two consecutive steps, and their op streams differ in known ways: under the
op recorder gradients accumulate out of place (``add`` where the plain step runs ``add_``), the
recorder's step adds ``detach`` calls, and ``reshape`` becomes ``view`` (``_reshape_alias``
without it). A key is an op's name without namespace, overload or in-place underscore, with
those aliases folded, and the shapes of its tensor inputs (0-d ones left out). The streams are
aligned on these keys in order (``difflib``), then the gaps between aligned runs once more on
the names alone (shapes that changed between the steps: a dynamic batch).
"""

from __future__ import annotations

import difflib
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

_ALIASES = {"_reshape_alias": "view"}


@dataclass(frozen=True)
class Alignment:
    """Which content op each timed op event is (None: no content op aligned with it)."""

    content_of_timed: tuple[int | None, ...]

    @property
    def num_aligned(self) -> int:
        return sum(index is not None for index in self.content_of_timed)


def op_name_key(name: str) -> str:
    """``aten.add.Tensor`` (a recorded op) and ``aten::add_`` (a profiler event) as ``add``."""
    if "::" in name:
        base = name.split("::", 1)[1]
    else:
        parts = name.split(".")
        base = parts[1] if len(parts) > 1 else parts[0]
    base = base.rstrip("_") or base
    return _ALIASES.get(base, base)


def align(
    content: Sequence[tuple[str, tuple[tuple[int, ...], ...]]],
    timed: Sequence[tuple[str, tuple[tuple[int, ...], ...]]],
) -> Alignment:
    """Align two op streams of (name, input shapes): the content pass's and the timed pass's."""
    content_keys = [_key(name, shapes) for name, shapes in content]
    timed_keys = [_key(name, shapes) for name, shapes in timed]
    content_of_timed: list[int | None] = [None] * len(timed)
    matcher = difflib.SequenceMatcher(None, content_keys, timed_keys, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            for k in range(i2 - i1):
                content_of_timed[j1 + k] = i1 + k
        elif tag == "replace":  # the same ops at other shapes?
            _match(
                [key[0] for key in content_keys[i1:i2]],
                [key[0] for key in timed_keys[j1:j2]],
                i1, j1, content_of_timed,
            )
    return Alignment(content_of_timed=tuple(content_of_timed))


def _key(name: str, shapes: tuple[tuple[int, ...], ...]) -> tuple[str, tuple]:
    # without 0-d inputs: the profiler records a Python number as one (``x + 1``), the recorder
    # sees the number
    return op_name_key(name), tuple(shape for shape in shapes if shape)


def _match(
    a: list[Hashable], b: list[Hashable], a0: int, b0: int, out: list[int | None]
) -> None:
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    for block in matcher.get_matching_blocks():
        for k in range(block.size):
            out[b0 + block.b + k] = a0 + block.a + k


def kernel_ops(
    launched_by: Sequence[int | None],
    alignment: Alignment,
    is_view: Sequence[bool],
    is_collective: Sequence[bool],
) -> tuple[list[int | None], int]:
    """The content op of each kernel, from the timed op event that launched it (None: launched
    outside every op event), and how many kernels went to a neighbour: a kernel of an op event
    that no content op aligned with goes to the nearest aligned op before it that is not a
    view (``is_view``, per content op: a view launches nothing), after it when there is none,
    so no device time is lost. The kernels of an unaligned collective (``is_collective``, per
    timed op event) stay with the step (None), as in a one-pass capture: a communication
    kernel's time, waiting for the other ranks included, is no neighbour's compute."""
    content_of_timed = alignment.content_of_timed
    hosts = [
        None if index is None or is_view[index] else index for index in content_of_timed
    ]
    nearest: list[int | None] = []
    previous = None
    for host in hosts:
        previous = host if host is not None else previous
        nearest.append(previous)
    following = None
    for position in range(len(hosts) - 1, -1, -1):
        following = hosts[position] if hosts[position] is not None else following
        if nearest[position] is None:
            nearest[position] = following
    ops: list[int | None] = []
    num_to_neighbour = 0
    for position in launched_by:
        if position is None:
            ops.append(None)
        elif content_of_timed[position] is not None:
            ops.append(content_of_timed[position])
        elif is_collective[position]:
            ops.append(None)
        else:
            ops.append(nearest[position])
            num_to_neighbour += 1
    return ops, num_to_neighbour
