"""Aligning the timed pass's op events with the content pass's op records, and giving each
kernel of the timed pass to a content op.

The two passes run two consecutive steps, and their op streams differ in known ways: under the
op recorder gradients accumulate out of place (``add`` where the plain step runs ``add_``), the
recorder's step adds ``detach`` calls, and ``reshape`` becomes ``view`` (``_reshape_alias``
without it). A key is an op's name without namespace, overload or in-place underscore, with
those aliases folded, and the shapes of its tensor inputs (0-d ones left out). The streams are
aligned on these keys in order, then the gaps between aligned runs once more on the names alone
(shapes that changed between the steps: a dynamic batch).

The alignment is a longest common subsequence by Myers' O((N + M) D) algorithm: two passes of
one step differ in few places (D edits), so it takes tens of milliseconds on a 4,000-op step,
where ``difflib``'s longest-block search, quadratic on the repeated keys of a stack of identical
blocks, took seconds. Past :data:`MAX_EDITS` edits (steps that differ throughout) it gives way
to ``difflib``.
"""

from __future__ import annotations

import difflib
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

_ALIASES = {"_reshape_alias": "view"}
# beyond this many insertions and deletions the streams are not two runs of one step, and
# Myers' trace (about D^2 entries) would grow large: difflib aligns them instead
MAX_EDITS = 1500


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
    pairs = _common_subsequence(content_keys, timed_keys)
    if pairs is None:
        matcher = difflib.SequenceMatcher(None, content_keys, timed_keys, autojunk=False)
        pairs = [
            (block.a + k, block.b + k)
            for block in matcher.get_matching_blocks()
            for k in range(block.size)
        ]
    i, j = 0, 0
    for a, b in [*pairs, (len(content_keys), len(timed_keys))]:
        if a > i and b > j:  # a gap on both sides: the same ops at other shapes?
            _match([key[0] for key in content_keys[i:a]], [key[0] for key in timed_keys[j:b]],
                   i, j, content_of_timed)
        if b < len(timed_keys):
            content_of_timed[b] = a
        i, j = a + 1, b + 1
    return Alignment(content_of_timed=tuple(content_of_timed))


def _common_subsequence(
    a: Sequence[Hashable], b: Sequence[Hashable], max_edits: int = MAX_EDITS
) -> list[tuple[int, int]] | None:
    """The index pairs ``(i, j)`` of a longest common subsequence of ``a`` and ``b`` (``a[i] ==
    b[j]``, increasing in both), by Myers' greedy algorithm; None past ``max_edits`` edits."""
    n, m = len(a), len(b)
    # furthest x reached on each diagonal k = x - y, stored at k + offset; v[offset + 1] = 0
    # starts the walk at (0, 0)
    limit = min(max_edits, n + m)
    offset = limit + 1
    v = [0] * (2 * limit + 3)
    trace: list[list[int]] = []
    for d in range(limit + 1):
        trace.append(v[offset - d - 1:offset + d + 2])  # v before round d, diagonals -d-1..d+1
        for k in range(-d, d + 1, 2):
            if k == -d or (k != d and v[offset + k - 1] < v[offset + k + 1]):
                x = v[offset + k + 1]  # down: b[y] inserted
            else:
                x = v[offset + k - 1] + 1  # right: a[x] deleted
            y = x - k
            while x < n and y < m and a[x] == b[y]:
                x += 1
                y += 1
            v[offset + k] = x
            if x >= n and y >= m:
                return _backtrack(trace, n, m)
    return None


def _backtrack(trace: list[list[int]], x: int, y: int) -> list[tuple[int, int]]:
    pairs: list[tuple[int, int]] = []
    for d in range(len(trace) - 1, -1, -1):
        v = trace[d]  # v[k + d + 1] is diagonal k's furthest x before round d
        k = x - y
        if k == -d or (k != d and v[k - 1 + d + 1] < v[k + 1 + d + 1]):
            previous_k = k + 1
        else:
            previous_k = k - 1
        previous_x = v[previous_k + d + 1]
        previous_y = previous_x - previous_k
        while x > previous_x and y > previous_y:  # the diagonal run that ended round d
            x -= 1
            y -= 1
            pairs.append((x, y))
        x, y = previous_x, previous_y
    pairs.reverse()
    return pairs


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
