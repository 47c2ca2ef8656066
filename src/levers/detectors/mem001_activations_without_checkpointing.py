"""MEM001 activations-without-checkpointing: the peak is dominated by activations kept for backward.

## What it does
When no activation checkpointing runs in the step, measures how much of the peak is activations
(live bytes at the end of the forward pass minus the start of the step), by module, and
estimates the headroom that per-block checkpointing of each family of repeated blocks
(`text.layers.*`, `vision.blocks.*`) would buy. It fires when activations are at least half of
what the step adds to memory above its start (parameters, gradients and optimizer state) and the
headroom is at least 5% of the activations.

## Why is this bad?
Every block keeps its intermediate activations alive until backward. Checkpointing keeps only
each block's input and recomputes the rest during backward, one block at a time: memory that
buys batch size, which usually nets positive throughput despite the recomputation (about one
extra forward of the checkpointed blocks).

## Example
```python
for block in self.blocks:
    x = block(x)
```

Use instead:
```python
for block in self.blocks:
    x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
```

## Fix
Non-reentrant per-block checkpointing (lever `activation-checkpointing`, not implemented yet),
then re-tune the batch size into the freed memory.

## Fix safety
Exact: recomputation reproduces the forward bitwise for deterministic ops (dropout restores its
RNG state).

## Known problems
The activation figure comes from the live-bytes timeline (tracked tensor storages on a CPU, the
allocator on a GPU), not from the memory model; the headroom is a first-order estimate that
assumes each block's input is its predecessor's output. The block call line is found by reading
the source for a loop over the blocks' ModuleList attribute.

## References
- https://pytorch.org/docs/stable/checkpoint.html
- Chen et al., Training Deep Nets with Sublinear Memory Cost (2016), https://arxiv.org/abs/1604.06174
"""

from __future__ import annotations

from collections.abc import Iterator

from levers.capture.records import Capture
from levers.detectors.activations import (
    ActivationProfile,
    BlockFamily,
    activation_profile,
)
from levers.detectors.block_calls import block_call_sites
from levers.detectors.config import RuleConfig
from levers.detectors.finding import Finding, Receipt, Work
from levers.detectors.patterns import fmt_bytes, receipt
from levers.detectors.registry import rule

CODE, NAME = "MEM001", "activations-without-checkpointing"
# activations must be at least this share of the peak above the step's starting memory
# (parameters, gradients, optimizer state): the dynamic term checkpointing acts on
MIN_ACTIVATION_SHARE = 0.5
# and the estimated headroom at least this share of the activations
MIN_HEADROOM_SHARE = 0.05


@rule(CODE, NAME)
def check(capture: Capture, config: RuleConfig) -> Iterator[Finding]:
    # checkpointing already runs: the headroom is taken
    if capture.settings.get("activation_checkpointing"):
        return
    profile = activation_profile(capture)
    # no live-bytes timeline, or no repeated blocks to checkpoint
    if profile is None or not profile.families:
        return
    dynamic = profile.peak_bytes - profile.start_bytes
    # activations do not dominate what the step adds to memory
    if dynamic <= 0 or profile.activation_bytes < MIN_ACTIVATION_SHARE * dynamic:
        return
    # too little to gain for the recomputation it costs
    if profile.headroom_bytes < MIN_HEADROOM_SHARE * profile.activation_bytes:
        return
    yield _finding(profile, capture)


def _receipts(
    families: tuple[BlockFamily, ...], capture: Capture
) -> tuple[Receipt, ...]:
    files = {
        op.source.file
        for op in capture.ops
        if op.source is not None and not op.source.file.startswith("<")
    }
    receipts = []
    for fam in families:
        sites = block_call_sites(files, fam.attribute)
        first = capture.ops[fam.first_op]
        common = {
            "module": fam.name,
            "op": f"{fam.num_blocks} blocks",
            "shapes": f"{fmt_bytes(fam.activation_bytes)} of activations, ~{fmt_bytes(fam.headroom_bytes)} freed",
            "count": fam.num_blocks,
        }
        if sites:
            receipts.extend(receipt(site, **common) for site in sites)
        else:
            receipts.append(receipt(first.source, **common))
    return tuple(receipts)


def _finding(profile: ActivationProfile, capture: Capture) -> Finding:
    peak = profile.peak_bytes
    acts = profile.activation_bytes
    groups = ", ".join(
        f"{name} {fmt_bytes(b)}"
        for name, b in list(profile.by_group.items())[:4]
        if b > 0
    )
    families = [f for f in profile.families if f.headroom_bytes > 0] or list(
        profile.families
    )
    message = (
        f"No activation checkpointing: activations are {fmt_bytes(acts)} of the "
        f"{fmt_bytes(peak)} peak ({acts / peak:.0%}; {acts / max(peak - profile.start_bytes, 1):.0%} "
        f"of what the step adds to its starting {fmt_bytes(profile.start_bytes)}); by module: {groups}. Per-block "
        "checkpointing of "
        + ", ".join(f"{f.name} ({f.num_blocks} blocks)" for f in families)
        + f" would free about {fmt_bytes(profile.headroom_bytes)} "
        f"({profile.headroom_bytes / peak:.0%} of the peak) for one extra forward of those blocks."
    )
    return Finding(
        code=CODE,
        name=NAME,
        message=message,
        fix_title="Checkpoint each block (torch.utils.checkpoint, use_reentrant=False), then raise the batch size",
        receipts=_receipts(tuple(families), capture),
        severity="high" if profile.headroom_bytes >= 0.1 * peak else "medium",
        effort="S",
        risk="low",
        lever="activation-checkpointing",
        fix_safety="exact",
        work=Work(
            now=(),
            fixed=(),
            now_ops=(),
            fixed_extra_ops=tuple(i for f in families for i in f.forward_ops),
            saved_bytes=profile.headroom_bytes,
        ),
        details={
            "activation_bytes": acts,
            "peak_bytes": peak,
            "by_module": profile.by_group,
            "families": {
                f.name: {
                    "blocks": f.num_blocks,
                    "activation_bytes": f.activation_bytes,
                    "headroom_bytes": f.headroom_bytes,
                }
                for f in profile.families
            },
        },
    )
