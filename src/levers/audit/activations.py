"""Activation memory from the capture's live-bytes timeline, by repeated block.

Activations are what the forward pass leaves alive for backward: the live bytes after the last
forward op minus the live bytes at the start of the step. Each forward op's change in live bytes
is charged to the block it ran in (``text.layers.3``: the module path up to its first numbered
component) or, outside numbered blocks, to the top-level module.

With per-block activation checkpointing, a block keeps only its input until backward, and one
block's activations at a time are rebuilt during backward, so the headroom it buys is about

    sum(block activations) - sum(block inputs) - max(block activations)

per family of repeated blocks (``text.layers.*``).
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass

from levers.capture.records import Capture, OpRecord

_NUMBERED = re.compile(r"^(.*?\.\d+)(?:\.|$)")


@dataclass(frozen=True)
class BlockFamily:
    name: str  # "text.layers.*"
    attribute: str  # "layers": the ModuleList attribute the blocks live in
    num_blocks: int
    activation_bytes: int  # all blocks together
    input_bytes: int  # what checkpointing would keep: one input per block
    largest_block_bytes: int
    forward_ops: tuple[int, ...]  # the blocks' forward ops (what recomputation re-runs)
    first_op: int  # the first op of the first block

    @property
    def headroom_bytes(self) -> int:
        return max(
            self.activation_bytes - self.input_bytes - self.largest_block_bytes, 0
        )


@dataclass(frozen=True)
class ActivationProfile:
    start_bytes: int
    end_of_forward_bytes: int
    peak_bytes: int
    by_group: dict[str, int]  # group label -> bytes left alive by its forward ops
    families: tuple[BlockFamily, ...]

    @property
    def activation_bytes(self) -> int:
        return max(self.end_of_forward_bytes - self.start_bytes, 0)

    @property
    def headroom_bytes(self) -> int:
        return sum(f.headroom_bytes for f in self.families)


def block_of(module: str | None) -> str | None:
    """``"text.layers.3.attn"`` -> ``"text.layers.3"``; None when not inside a numbered block."""
    if not module:
        return None
    match = _NUMBERED.match(module)
    return match.group(1) if match else None


def group_of(module: str | None) -> str:
    block = block_of(module)
    if block is not None:
        return re.sub(r"\.\d+$", ".*", block)
    if module is None:
        return "<outside model>"
    if module == "":
        return "<model>"
    return module.split(".")[0]


def activation_profile(capture: Capture) -> ActivationProfile | None:
    forward = [
        op for op in capture.ops if op.phase == "forward" and op.live_bytes is not None
    ]
    # no live-bytes timeline (or no forward pass): nothing to attribute
    if not forward:
        return None
    start = capture.memory.start_bytes
    by_group: dict[str, int] = defaultdict(int)
    by_block: dict[str, int] = defaultdict(int)
    block_ops: dict[str, list[OpRecord]] = defaultdict(list)
    previous = start
    for op in forward:
        delta = op.live_bytes - previous
        previous = op.live_bytes
        by_group[group_of(op.module)] += delta
        block = block_of(op.module)
        if block is not None:
            by_block[block] += delta
            block_ops[block].append(op)
    return ActivationProfile(
        start_bytes=start,
        end_of_forward_bytes=forward[-1].live_bytes,
        peak_bytes=capture.memory.peak_bytes,
        by_group=dict(sorted(by_group.items(), key=lambda kv: -kv[1])),
        families=_families(by_block, block_ops),
    )


def _families(
    by_block: dict[str, int], block_ops: dict[str, list[OpRecord]]
) -> tuple[BlockFamily, ...]:
    members: dict[str, list[str]] = defaultdict(list)
    for block in by_block:
        members[re.sub(r"\.\d+$", ".*", block)].append(block)
    families = []
    for name, blocks in members.items():
        # a single block gains nothing from checkpointing one block at a time
        if len(blocks) < 2:
            continue
        inputs = sum(_output_bytes(block_ops[b]) for b in blocks)
        families.append(
            BlockFamily(
                name=name,
                attribute=name.rsplit(".", 2)[-2] if name.count(".") >= 1 else name,
                num_blocks=len(blocks),
                activation_bytes=sum(max(by_block[b], 0) for b in blocks),
                input_bytes=inputs,
                largest_block_bytes=max(max(by_block[b], 0) for b in blocks),
                forward_ops=tuple(op.index for b in blocks for op in block_ops[b]),
                first_op=block_ops[blocks[0]][0].index,
            )
        )
    return tuple(sorted(families, key=lambda f: -f.headroom_bytes))


def _output_bytes(ops: list[OpRecord]) -> int:
    """Bytes of a block's output: its last op that wrote something."""
    for op in reversed(ops):
        if not op.is_view and op.outputs:
            return op.write_bytes
    return 0
