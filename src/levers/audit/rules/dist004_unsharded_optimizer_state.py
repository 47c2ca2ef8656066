"""DIST004 unsharded-optimizer-state: every data-parallel rank keeps the whole optimizer state.

## What it does
On a capture of more than one rank whose model is DDP-wrapped (not FSDP2), reads the bytes of
the optimizer's state after the step and the world size, and reports the bytes per rank that
sharding the state across the ranks (ZeRO-1) would free: the state times (N - 1) / N.

## Why is this bad?
Under DDP each rank holds identical parameters, gradients and optimizer state. Adam's two
moments are twice the parameters in float32; each rank updates all of them although it could
update one N-th and all-gather the parameters. The memory freed can hold a larger batch, or
spare activation checkpointing.

## Example
```python
model = DistributedDataParallel(model)
optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
```

Use instead:
```python
from torch.distributed.optim import ZeroRedundancyOptimizer

model = DistributedDataParallel(model)
optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=lr)
```

## Fix
PyTorch's ``ZeroRedundancyOptimizer`` (ZeRO-1), or FSDP2 (``fully_shard``), which also shards
parameters and gradients. No lever yet; ``levers memory --world-size N --strategy zero1``
predicts the per-rank peak with it. Where sharding is not an option, or on top of it, Adam's
state can be made smaller on every rank, changing numerics: lever `adamw-bf16-state` (bf16
moments, half the state) or `adamw-8bit` (torchao's AdamW8bit, about a quarter); `levers memory`'s
`bf16-optimizer-states` and `8bit-optimizer-states` what-ifs predict the bytes each frees, and
`levers ab`'s held-out loss over 500 steps or more is their proof. They are not this finding's
lever: its fix, sharding, is exact.

## Fix safety
Exact in exact arithmetic (each rank runs the same update on its shard); the all-gather of the
updated parameters is a copy. Checkpoints must be consolidated (``consolidate_state_dict``).

## Known problems
The state is counted after the captured step (it is created lazily on the first step). The
extra all-gather costs time per step that this rule does not price. Ranks are taken from the
process group the capture ran in.

## References
- https://pytorch.org/docs/stable/distributed.optim.html (ZeroRedundancyOptimizer)
- https://pytorch.org/docs/stable/distributed.fsdp.fully_shard.html
"""

from __future__ import annotations

from collections.abc import Iterator

from levers.audit.config import RuleConfig
from levers.audit.finding import Finding, Work
from levers.audit.patterns import fmt_bytes
from levers.vocab import EXACT
from levers.audit.rules.registry import registered, rule
from levers.audit.scale import (
    MIN_SHARDING_SAVED_BYTES,
    model_call_receipt,
    sharding_saved_bytes,
    world_size,
)
from levers.capture.records import Capture

CODE, NAME = "DIST004", "unsharded-optimizer-state"
MEDIUM_SAVED_BYTES = 2**30


@rule(CODE, NAME, severity="medium", fix_safety=EXACT)
def check(capture: Capture, config: RuleConfig) -> Iterator[Finding]:
    saved = sharding_saved_bytes(capture)
    # not DDP over 2+ ranks with an unsharded optimizer, or too little to be worth the extra
    # all-gather
    if saved < MIN_SHARDING_SAVED_BYTES:
        return
    ranks = world_size(capture)
    optimizer = capture.settings["optimizer"]
    state = int(optimizer.get("state_bytes") or 0)
    yield registered(CODE).finding(
        message=(
            f"each of the {ranks} DDP ranks holds the whole {optimizer.get('class')} state, "
            f"{fmt_bytes(state)}; sharded across the ranks (ZeRO-1) it is {fmt_bytes(state // ranks)} "
            f"per rank, {fmt_bytes(saved)} less."
        ),
        fix_title="Shard the optimizer state: ZeroRedundancyOptimizer (ZeRO-1) or FSDP2 fully_shard",
        receipts=(
            model_call_receipt(
                capture,
                op=f"{optimizer.get('class')} under DDP",
                shapes=f"{optimizer.get('num_params')} parameter tensors, {ranks} ranks",
            ),
        ),
        severity="medium" if saved >= MEDIUM_SAVED_BYTES else "low",
        effort="M",
        risk="low",
        lever=None,
        work=Work(saved_bytes=saved),
        details={"state_bytes": state, "world_size": ranks, "saved_bytes_per_rank": saved},
    )
