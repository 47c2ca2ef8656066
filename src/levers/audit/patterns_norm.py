"""RMSNorm and LayerNorm written as elementwise and reduction ops.

A hand-rolled norm shows up as a reduction over the last dimension with keepdim (``mean`` or
``var`` writing [.., 1]) followed within a few ops by ``rsqrt`` or ``sqrt``, inside a run of
elementwise ops of one module and one source function (pow, add, sub, mul, div, casts, views).
Ops inside a recorded F.rms_norm / F.layer_norm / F.group_norm call are not candidates: on a CPU
F.rms_norm decomposes into the same aten ops, and those are the fused op, not a hand-rolled one.
"""

from __future__ import annotations

from dataclasses import dataclass

from levers.capture.records import Capture, OpRecord, TensorMeta
from levers.audit.patterns import base_name, call_op_indices

REDUCTIONS = {"mean", "var", "var_mean", "std"}
ROOTS = {"rsqrt", "sqrt"}
ELEMENTWISE = {
    "pow",
    "mean",
    "var",
    "var_mean",
    "std",
    "rsqrt",
    "sqrt",
    "add",
    "sub",
    "mul",
    "div",
    "_to_copy",
    "reciprocal",
    "neg",
    "square",
    "addcmul",
    "add_",
    "mul_",
    "div_",
    "sub_",
}
VIEWS = {
    "detach",
    "view",
    "_unsafe_view",
    "expand",
    "unsqueeze",
    "squeeze",
    "alias",
    "reshape",
}
ROOT_WINDOW = 6  # ops between the reduction and the (r)sqrt
BACK_LIMIT = 6  # elementwise ops taken in before the reduction


@dataclass(frozen=True)
class NormChain:
    ops: tuple[int, ...]
    reduction: int
    input: TensorMeta  # the normalised tensor, [.., H]
    kind: str  # "RMSNorm" or "LayerNorm"


def _chain_op(op: OpRecord) -> bool:
    name = base_name(op.name)
    return name in ELEMENTWISE or name in VIEWS


def _same_scope(a: OpRecord, b: OpRecord) -> bool:
    return (
        a.module == b.module
        and a.phase == b.phase
        and a.source is not None
        and b.source is not None
        and a.source.file == b.source.file
        and a.source.function == b.source.function
    )


def find_unfused_norms(capture: Capture) -> list[NormChain]:
    ops = capture.ops
    excluded = call_op_indices(capture, ("norm", "sdpa", "loss"))
    chains: list[NormChain] = []
    last_end = -1
    for r in ops:
        if r.phase != "forward" or r.recompute or base_name(r.name) not in REDUCTIONS:
            continue
        if r.index in excluded or r.index <= last_end or not _keepdim_last(r):
            continue
        root = next(
            (
                op
                for op in ops[r.index + 1 : r.index + 1 + ROOT_WINDOW]
                if base_name(op.name) in ROOTS
                and op.index not in excluded
                and _same_scope(op, r)
            ),
            None,
        )
        if root is None:
            continue
        start = r.index
        taken = 0
        while start - 1 > last_end and taken < BACK_LIMIT:
            prev = ops[start - 1]
            if (
                prev.index in excluded
                or not _chain_op(prev)
                or not _same_scope(prev, r)
            ):
                break
            start -= 1
            taken += 1
        end = root.index
        while end + 1 < len(ops):
            nxt = ops[end + 1]
            if nxt.index in excluded or not _chain_op(nxt) or not _same_scope(nxt, r):
                break
            end += 1
        members = ops[start : end + 1]
        names = {base_name(op.name) for op in members}
        kind = (
            "LayerNorm"
            if ("sub" in names or "var" in names or "var_mean" in names)
            else "RMSNorm"
        )
        chains.append(
            NormChain(tuple(op.index for op in members), r.index, r.inputs[0], kind)
        )
        last_end = end
    return chains


def _keepdim_last(op: OpRecord) -> bool:
    """A reduction of the last dimension that keeps it: [.., H] -> [.., 1]."""
    if not op.inputs or not op.outputs:
        return False
    shape_in, shape_out = op.inputs[0].shape, op.outputs[0].shape
    return (
        len(shape_in) >= 2
        and len(shape_out) == len(shape_in)
        and shape_out[-1] == 1
        and shape_in[-1] > 1
        and tuple(shape_out[:-1]) == tuple(shape_in[:-1])
    )
