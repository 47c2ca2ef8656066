"""Elementwise chains that fused kernels replace: SwiGLU (silu(gate) * up) and rotate-half RoPE
(x * cos + rotate_half(x) * sin, with rotate_half a neg and a cat of the two halves).

Found by op names, shapes and adjacency in the forward pass (views skipped), within one module:
the capture has no tensor identities.
"""

from __future__ import annotations

from dataclasses import dataclass

from levers.capture.records import Capture, OpRecord, TensorMeta
from levers.audit.patterns import base_name

GATES = {"silu": "SwiGLU", "gelu": "GeGLU"}
GATE_WINDOW = 6  # non-view ops after the activation in which the product must come
ROPE_WINDOW = 6  # non-view ops after the cat in which the final add must come
ROPE_LOOKBACK = 4  # non-view ops before the neg in which the x * cos product may come


@dataclass(frozen=True)
class Chain:
    kind: str  # "SwiGLU", "GeGLU", "RoPE"
    ops: tuple[int, ...]  # the forward ops of the chain, in order (views excluded)
    anchor: int  # the op whose source line is the receipt (the mul, or the final add)
    output: TensorMeta


def _related(a: str | None, b: str | None) -> bool:
    """The same module, or one inside the other (an activation module inside its MLP)."""
    if a is None or b is None:
        return a == b
    return a == b or a.startswith(b + ".") or b.startswith(a + ".")


def _next_ops(ops, start: int, count: int, module) -> list[OpRecord]:
    found = []
    for op in ops[start:]:
        if len(found) >= count or op.phase != "forward" or not _related(op.module, module):
            break
        if not op.is_view:
            found.append(op)
    return found


def _prev_ops(ops, end: int, count: int, module) -> list[OpRecord]:
    found = []
    for op in reversed(ops[:end]):
        if len(found) >= count or op.phase != "forward" or op.module != module:
            break
        if not op.is_view:
            found.append(op)
    return found


def find_gated_activations(capture: Capture) -> list[Chain]:
    """silu(gate) * up (and gelu): the activation and the product, as two kernels."""
    ops = capture.ops
    chains = []
    for op in ops:
        kind = GATES.get(base_name(op.name))
        if kind is None or op.phase != "forward" or op.recompute or not op.outputs:
            continue
        out = op.outputs[0]
        # the up projection may run between the activation and the product, in the same MLP
        parent = op.module.rsplit(".", 1)[0] if op.module and "." in op.module else op.module
        for nxt in _next_ops(ops, op.index + 1, GATE_WINDOW, parent):
            # gate times up: both factors have the activation's shape (not a scale or a mask)
            if base_name(nxt.name) == "mul" and sum(m.shape == out.shape for m in nxt.inputs) >= 2:
                chains.append(Chain(kind, (op.index, nxt.index), nxt.index, nxt.outputs[0]))
                break
    return chains


def find_unfused_rope(capture: Capture) -> list[Chain]:
    """x * cos + cat(-x2, x1) * sin, as separate slice, neg, cat, mul and add kernels."""
    ops = capture.ops
    chains = []
    for op in ops:
        if base_name(op.name) != "neg" or op.phase != "forward" or op.recompute or not op.outputs:
            continue
        half = op.outputs[0].shape
        after = _next_ops(ops, op.index + 1, ROPE_WINDOW + 1, op.module)
        if not after or base_name(after[0].name) != "cat" or not after[0].outputs:
            continue
        full = after[0].outputs[0].shape
        if len(full) != len(half) or full[:-1] != half[:-1] or full[-1] != 2 * half[-1]:
            continue
        add = next(
            (o for o in after[1:] if base_name(o.name) == "add" and o.outputs
             and o.outputs[0].shape == full),
            None,
        )
        if add is None or not any(base_name(o.name) == "mul" for o in after[1:]):
            continue
        # the x * cos product, when it comes before rotate_half (and after the previous chain)
        floor = chains[-1].anchor if chains else -1
        before = [
            o for o in _prev_ops(ops, op.index, ROPE_LOOKBACK, op.module)
            if o.index > floor and base_name(o.name) == "mul" and o.outputs
            and o.outputs[0].shape == full
        ]
        first = min((o.index for o in before), default=op.index)
        indices = tuple(
            o.index for o in ops[first : add.index + 1] if not o.is_view
        )
        chains.append(Chain("RoPE", indices, add.index, add.outputs[0]))
    return chains
