"""DIST001 ddp-small-buckets: DDP all-reduces its gradients in many buckets smaller than its default.

## What it does
On a DDP-wrapped model, reads the gradient all-reduces of backward (one per DDP bucket, with the
bucket's flat shape) and the wrapper's ``bucket_cap_mb``. When the cap is below DDP's default
of 25 MiB and the step runs at least twice as many bucket all-reduces as the default cap would
(and at least four), it reports the buckets, their sizes and the count at the default.

## Why is this bad?
Every all-reduce pays a fixed cost (a kernel launch, NCCL's protocol handshake and its latency
across the ranks) whatever its size; small buckets are latency-bound and reach a fraction of
the link's bandwidth. Many small buckets also make DDP's reducer do more bookkeeping per step.
Larger buckets overlap less at the very end of backward, which is why the default is 25 MiB
rather than one bucket.

## Example
```python
model = DistributedDataParallel(model, bucket_cap_mb=1)
```

Use instead:
```python
model = DistributedDataParallel(model)  # bucket_cap_mb=25, or larger on a fast interconnect
```

## Fix
Raise ``bucket_cap_mb`` (no lever yet; a one-argument change). Measure with ``levers ab``
under torchrun: the best cap depends on the interconnect and on how backward overlaps.

## Fix safety
Exact: the bucketing changes which gradients travel together, not the values reduced.

## Known problems
On a CPU capture (gloo) no time is put on the finding: gloo's latency says nothing about NCCL's.
DDP rebuilds its buckets after the first iteration in the order gradients became ready; a
capture after warm-up sees the rebuilt buckets.

## References
- https://pytorch.org/docs/stable/notes/ddp.html (gradient bucketing)
- https://pytorch.org/docs/stable/generated/torch.nn.parallel.DistributedDataParallel.html
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterator

from levers.audit.config import RuleConfig
from levers.audit.finding import Finding
from levers.audit.patterns import fmt_bytes
from levers.vocab import EXACT
from levers.audit.rules.registry import registered, rule
from levers.audit.scale import ddp_settings, model_call_receipt
from levers.capture.collectives import buckets, collectives, op_bytes
from levers.capture.records import Capture

CODE, NAME = "DIST001", "ddp-small-buckets"
DEFAULT_BUCKET_CAP_MB = 25.0
MIB = 2**20
MIN_BUCKETS = 4


@rule(CODE, NAME, severity="medium", fix_safety=EXACT)
def check(capture: Capture, config: RuleConfig) -> Iterator[Finding]:
    ddp = ddp_settings(capture)
    # not a DDP-wrapped model
    if ddp is None:
        return
    cap_mb = float(ddp.get("bucket_cap_mb") or DEFAULT_BUCKET_CAP_MB)
    # the default cap or larger: the buckets are as large as DDP makes them
    if cap_mb >= DEFAULT_BUCKET_CAP_MB:
        return
    ops = buckets(collectives(capture))
    # too few all-reduces for their latency to matter
    if len(ops) < MIN_BUCKETS:
        return
    sizes = [op_bytes(op) for op in ops]
    total = sum(sizes)
    at_default = max(1, math.ceil(total / (DEFAULT_BUCKET_CAP_MB * MIB)))
    # the default cap would not make far fewer all-reduces
    if len(ops) < 2 * at_default:
        return
    median = int(statistics.median(sizes))
    yield registered(CODE).finding(
        message=(
            f"DDP all-reduces {fmt_bytes(total)} of gradients in {len(ops)} buckets (median "
            f"{fmt_bytes(median)}, bucket_cap_mb={cap_mb:.3g}); at the default 25 MiB the same "
            f"gradients travel in {at_default}, and each all-reduce pays a fixed latency "
            "whatever its size."
        ),
        fix_title=f"Raise bucket_cap_mb from {cap_mb:.3g} to the default 25 (or more)",
        receipts=(
            model_call_receipt(
                capture,
                op="c10d.allreduce_ (DDP buckets)",
                shapes=f"{len(ops)} buckets, {fmt_bytes(total)}",
                count=len(ops),
            ),
        ),
        severity="medium" if len(ops) >= 4 * at_default else "low",
        effort="S",
        risk="low",
        lever=None,
        details={
            "num_buckets": len(ops),
            "bucket_bytes": sizes,
            "total_bytes": total,
            "bucket_cap_mb": cap_mb,
            "num_buckets_at_default": at_default,
        },
    )
