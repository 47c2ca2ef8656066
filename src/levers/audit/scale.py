"""What the scale rules (DIST*) share: the capture's distribution settings and a receipt.

The collectives run inside autograd's engine and carry no user source line, so a scale
finding's receipt is the first line of user code that the wrapped model's forward ran (the
model's own ``forward``, or the step's call of a model built of torch modules): the model
whose DDP or FSDP2 wrapper the fix changes.
"""

from __future__ import annotations

from typing import Any

from levers.audit.finding import Receipt
from levers.capture.records import Capture


def distributed(capture: Capture) -> dict[str, Any]:
    return dict(capture.settings.get("distributed") or {})


def ddp_settings(capture: Capture) -> dict[str, Any] | None:
    """The DDP wrapper's settings (bucket_cap_mb, find_unused_parameters, ...), or None."""
    return distributed(capture).get("ddp")


def world_size(capture: Capture) -> int:
    info = distributed(capture)
    ddp = info.get("ddp") or {}
    return int(max(info.get("world_size") or 1, ddp.get("world_size") or 1))


# the optimizers whose state is sharded across the ranks already
SHARDED_OPTIMIZERS = ("ZeroRedundancyOptimizer",)
# below a MiB per rank sharding the state is not worth its all-gather (DIST004 stays quiet)
MIN_SHARDING_SAVED_BYTES = 2**20


def sharding_saved_bytes(capture: Capture) -> int:
    """The optimizer-state bytes per rank that sharding it across the DDP ranks (ZeRO-1) would
    free: the state times (N - 1) / N; 0 unless the model is DDP-wrapped (FSDP2 shards already)
    over 2 ranks or more and its optimizer does not shard its state. DIST004 reports it; MEM004
    stays quiet where DIST004 fires (sharding is exact, the smaller state is not)."""
    # only DDP replicates the state; FSDP2 shards it already
    if distributed(capture).get("strategy") != "ddp":
        return 0
    ranks = world_size(capture)
    optimizer = capture.settings.get("optimizer") or {}
    # one rank has nothing to shard across; no optimizer, or one that shards its state already
    if ranks < 2 or not optimizer or optimizer.get("class") in SHARDED_OPTIMIZERS:
        return 0
    return int(optimizer.get("state_bytes") or 0) * (ranks - 1) // ranks


def model_call_receipt(capture: Capture, *, op: str, shapes: str, count: int = 1) -> Receipt:
    source = next(
        (o.source for o in capture.ops if o.phase == "forward" and o.source is not None), None
    )
    return Receipt(
        file=source.file if source else "<unknown>",
        line=source.line if source else 0,
        code=source.code if source else "",
        module=None,
        op=op,
        shapes=shapes,
        count=count,
    )
