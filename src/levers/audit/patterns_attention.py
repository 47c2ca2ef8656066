"""Attention written out by hand: matmul -> (scale, mask, casts) -> softmax -> matmul.

The capture has no tensor identities, so the chain is found by shapes and adjacency: a softmax
over a score-shaped tensor [.., Lq, Lk] (outside any SDPA, loss or norm call), the nearest
matmul before it in the same module that wrote a tensor with as many elements, and the nearest
matmul after it that read one. The chain then takes in the neighbouring ops on the source lines
of both matmuls (the scaling, the permute copies an einsum makes, the views after), so it covers
the attention code as written.
"""

from __future__ import annotations

from dataclasses import dataclass

from levers.capture.records import Capture, OpRecord, TensorMeta
from levers.audit.patterns import base_name, call_op_indices

SOFTMAX = {"_softmax", "softmax", "_safe_softmax"}
MATMUL = {"bmm", "mm", "matmul", "baddbmm", "einsum"}
MASKING = {"masked_fill", "masked_fill_", "where", "add", "add_"}
DROPOUT = {"native_dropout", "dropout", "bernoulli", "bernoulli_", "fused_dropout"}
WINDOW = 48  # ops searched on either side of a softmax


@dataclass(frozen=True)
class AttentionChain:
    ops: tuple[int, ...]  # every op of the pattern, in order
    first_matmul: int
    softmax: int
    second_matmul: int
    scores: TensorMeta  # the softmax input, [.., Lq, Lk]
    query: TensorMeta  # first matmul's first input, [.., Lq, D]
    value: TensorMeta  # second matmul's value input, [.., Lk, Dv]
    has_mask: bool
    has_dropout: bool
    upcast: bool  # scores or probabilities cast to float32 from a lower precision
    scores_written_bytes: int  # score-sized tensors the chain writes


def _numel(meta: TensorMeta) -> int:
    return meta.numel


def find_eager_attention(capture: Capture) -> list[AttentionChain]:
    ops = capture.ops
    excluded = call_op_indices(capture, ("sdpa", "loss", "norm"))
    chains: list[AttentionChain] = []
    last_end = -1
    for s in ops:
        if s.phase != "forward" or s.recompute or base_name(s.name) not in SOFTMAX:
            continue
        if (
            s.index in excluded
            or s.index <= last_end
            or not s.inputs
            or len(s.inputs[0].shape) < 3
        ):
            continue
        chain = _chain_around(ops, s, excluded, last_end)
        if chain is not None:
            chains.append(chain)
            last_end = chain.ops[-1]
    return chains


def _same_scope(a: OpRecord, b: OpRecord) -> bool:
    return a.module == b.module and a.phase == b.phase


def _chain_around(
    ops: tuple[OpRecord, ...], s: OpRecord, excluded: set[int], last_end: int
) -> AttentionChain | None:
    n = _numel(s.inputs[0])
    m1 = None
    for op in reversed(ops[max(last_end + 1, s.index - WINDOW) : s.index]):
        if op.index in excluded or not _same_scope(op, s):
            continue
        if base_name(op.name) in MATMUL and op.outputs and _numel(op.outputs[0]) == n:
            m1 = op
            break
    if m1 is None:
        return None
    m2 = None
    for op in ops[s.index + 1 : s.index + 1 + WINDOW]:
        if op.index in excluded or not _same_scope(op, s):
            continue
        if base_name(op.name) in MATMUL and any(_numel(t) == n for t in op.inputs):
            m2 = op
            break
    if m2 is None:
        return None
    start = _extend(ops, m1, -1, excluded, last_end)
    end = _extend(ops, m2, +1, excluded, last_end)
    members = ops[start : end + 1]
    value = next((t for t in m2.inputs if _numel(t) != n), m2.inputs[-1])
    middle = ops[m1.index + 1 : m2.index]
    score_ops = [
        op
        for op in members
        if not op.is_view and op.outputs and _numel(op.outputs[0]) == n
    ]
    return AttentionChain(
        ops=tuple(op.index for op in members),
        first_matmul=m1.index,
        softmax=s.index,
        second_matmul=m2.index,
        scores=s.inputs[0],
        query=m1.inputs[0],
        value=value,
        has_mask=any(_is_mask_op(op, n) for op in middle),
        has_dropout=any(base_name(op.name) in DROPOUT for op in middle),
        upcast=any(_is_upcast(op) for op in middle) or _softmax_upcasts(m1, s),
        scores_written_bytes=sum(
            op.write_bytes for op in score_ops if op.index != m2.index
        ),
    )


def _extend(
    ops: tuple[OpRecord, ...],
    anchor: OpRecord,
    direction: int,
    excluded: set[int],
    last_end: int,
) -> int:
    """The farthest index reachable from ``anchor`` through ops on its source line."""
    index = anchor.index
    while True:
        nxt = index + direction
        if nxt <= last_end or nxt < 0 or nxt >= len(ops):
            return index
        op = ops[nxt]
        if (
            op.index in excluded
            or not _same_scope(op, anchor)
            or op.source != anchor.source
        ):
            return index
        index = nxt


def _is_mask_op(op: OpRecord, n: int) -> bool:
    if base_name(op.name) not in MASKING or len(op.inputs) < 2:
        return False
    # a mask is a second tensor argument, broadcast against the scores
    return any(
        _numel(t) != n and len(t.shape) >= 2 for t in op.inputs[1:]
    ) or base_name(op.name).startswith("masked")


def _is_upcast(op: OpRecord) -> bool:
    return (
        base_name(op.name) == "_to_copy"
        and bool(op.inputs)
        and op.inputs[0].dtype in ("bfloat16", "float16")
        and bool(op.outputs)
        and op.outputs[0].dtype == "float32"
    )


def _softmax_upcasts(m1: OpRecord, s: OpRecord) -> bool:
    return bool(
        m1.outputs
        and m1.outputs[0].dtype in ("bfloat16", "float16")
        and s.outputs
        and s.outputs[0].dtype == "float32"
    )
