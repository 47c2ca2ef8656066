"""Helpers the rules share: op ranges of calls, backward ops of forward ops, module patterns,
receipts and shapes as text.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence

from levers.capture.records import CallRecord, Capture, OpRecord, SourceLoc, TensorMeta
from levers.audit.finding import Receipt
from levers.units import format_bytes

_INDEX = re.compile(r"(?<=\.)\d+(?=\.|$)|^\d+(?=\.|$)")

FLOAT_DTYPES = ("float32", "bfloat16", "float16", "float64")


def base_name(op_name: str) -> str:
    """``"aten.mm.default"`` -> ``"mm"``."""
    parts = op_name.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "aten" else parts[0]


def call_op_indices(capture: Capture, kinds: Iterable[str]) -> set[int]:
    """Indices of the ops dispatched inside calls of the given kinds (e.g. sdpa, norm, loss)."""
    kinds = set(kinds)
    inside: set[int] = set()
    for call in capture.calls:
        if (
            call.kind in kinds
            and call.first_op is not None
            and call.last_op is not None
        ):
            inside.update(range(call.first_op, call.last_op + 1))
    return inside


def backward_index(capture: Capture) -> dict[int, list[int]]:
    """forward op index -> indices of the backward ops its autograd node ran."""
    found: dict[int, list[int]] = defaultdict(list)
    for op in capture.ops:
        if op.forward_op is not None:
            found[op.forward_op].append(op.index)
    return found


def with_backward(
    indices: Iterable[int], backward: Mapping[int, Sequence[int]]
) -> tuple[int, ...]:
    """``indices`` plus the backward ops of each, sorted."""
    out = set(indices)
    for i in list(out):
        out.update(backward.get(i, ()))
    return tuple(sorted(out))


def collapse_module(path: str | None) -> str | None:
    """``"text.layers.3.attn"`` -> ``"text.layers.*.attn"``; None stays None, "" is the model."""
    if path is None:
        return None
    if path == "":
        return "<model>"
    return _INDEX.sub("*", path)


def module_pattern(paths: Iterable[str | None]) -> str | None:
    """One label for the modules of a group of ops: collapsed, deduplicated, sorted."""
    collapsed = sorted(
        {c for c in (collapse_module(p) for p in paths) if c is not None}
    )
    if not collapsed:
        return None
    return ", ".join(collapsed)


def meta_text(meta: TensorMeta | dict | None) -> str:
    if meta is None:
        return "None"
    if isinstance(meta, dict):
        return f"[{', '.join(str(d) for d in meta['shape'])}] {meta['dtype']}"
    return f"[{', '.join(str(d) for d in meta.shape)}] {meta.dtype}"


def receipt(
    source: SourceLoc | None,
    *,
    module: str | None,
    op: str,
    shapes: str,
    count: int = 1,
    end_line: int | None = None,
) -> Receipt:
    if source is None:
        return Receipt(
            file="<unknown>",
            line=0,
            code="",
            module=module,
            op=op,
            shapes=shapes,
            count=count,
        )
    return Receipt(
        file=source.file,
        line=source.line,
        code=source.code,
        module=module,
        op=op,
        shapes=shapes,
        count=count,
        end_line=end_line,
    )


def group_by_source(items: Iterable, source_of) -> dict[tuple[str, int], list]:
    """Group items by (file, line) of their source, in first-seen order."""
    groups: dict[tuple[str, int], list] = {}
    for item in items:
        src = source_of(item)
        key = (src.file, src.line) if src is not None else ("<unknown>", 0)
        groups.setdefault(key, []).append(item)
    return groups


def line_span(ops: Sequence[OpRecord], file: str) -> tuple[int, int]:
    """The first and last source line of ``ops`` in ``file``."""
    lines = [
        op.source.line for op in ops if op.source is not None and op.source.file == file
    ]
    return min(lines), max(lines)


def sum_bytes(ops: Iterable[OpRecord]) -> int:
    return sum(op.read_bytes + op.write_bytes for op in ops)


def sum_flops(ops: Iterable[OpRecord]) -> int:
    return sum(op.flops for op in ops)


def num_kernels(ops: Iterable[OpRecord]) -> int:
    """Ops that launch a kernel: everything but views."""
    return sum(1 for op in ops if not op.is_view)


def calls_of(capture: Capture, kind: str) -> list[CallRecord]:
    return [c for c in capture.calls if c.kind == kind]


def step_device(capture: Capture) -> str:
    return str(capture.env.get("device", "cpu"))


# bytes in messages read like the report's
fmt_bytes = format_bytes
