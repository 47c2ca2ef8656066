"""DIST003 fp32-gradient-allreduce: DDP all-reduces float32 gradients of a step that computes in bf16.

## What it does
On a DDP-wrapped model whose step ran under bfloat16 or float16 autocast, reads the dtype of
the gradient bucket all-reduces. When they are float32 and no DDP communication hook is
registered, it reports the bytes all-reduced per step and the bytes a 16-bit hook would send.

## Why is this bad?
Autocast keeps the parameters, and so the gradients, in float32; DDP then sends 4 bytes per
gradient element over the interconnect though the step computed in 16 bits. A compression hook
casts each bucket to bf16 before the all-reduce and back after, halving the bytes on the wire;
where the all-reduce is exposed (not hidden behind backward) that halves its time.

## Example
```python
model = DistributedDataParallel(model)
with torch.autocast("cuda", dtype=torch.bfloat16):
    loss = model(x).float().mean()
```

Use instead:
```python
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

model = DistributedDataParallel(model)
model.register_comm_hook(None, default_hooks.bf16_compress_hook)
```

## Fix
``register_comm_hook(None, default_hooks.bf16_compress_hook)`` (``fp16_compress_hook`` under
float16; no lever yet). Prove it with ``levers ab`` under torchrun, with its quality read.

## Fix safety
Changes numerics: the gradients are summed across ranks in bf16 (8 bits of mantissa), then
cast back; the optimizer still updates float32 parameters.

## Known problems
Only the bucket all-reduces are read; gradients reduced by hand (``dist.all_reduce`` in the
step) are not. A custom hook of any kind silences the rule, whatever it does.

## References
- https://pytorch.org/docs/stable/ddp_comm_hooks.html (bf16_compress_hook)
"""

from __future__ import annotations

from collections.abc import Iterator

from levers.audit.config import RuleConfig
from levers.audit.finding import Finding
from levers.audit.patterns import fmt_bytes
from levers.vocab import CHANGES_NUMERICS
from levers.audit.rules.registry import registered, rule
from levers.audit.scale import ddp_settings, model_call_receipt
from levers.capture.collectives import buckets, collectives, op_bytes
from levers.capture.records import Capture

CODE, NAME = "DIST003", "fp32-gradient-allreduce"
HOOKS = {"bfloat16": "bf16_compress_hook", "float16": "fp16_compress_hook"}


def _autocast_dtype(capture: Capture) -> str | None:
    """The 16-bit dtype of any autocast region the step ran ("cuda:bfloat16" -> "bfloat16")."""
    dtypes = {entry.split(":", 1)[-1] for entry in capture.settings.get("autocast") or ()}
    return next((d for d in ("bfloat16", "float16") if d in dtypes), None)


@rule(CODE, NAME, severity="medium", fix_safety=CHANGES_NUMERICS)
def check(capture: Capture, config: RuleConfig) -> Iterator[Finding]:
    ddp = ddp_settings(capture)
    # not a DDP-wrapped model
    if ddp is None:
        return
    # a communication hook already decides what travels
    if ddp.get("comm_hook"):
        return
    dtype = _autocast_dtype(capture)
    # the step does not compute in 16 bits: float32 gradients are its precision
    if dtype is None:
        return
    ops = [op for op in buckets(collectives(capture)) if op.inputs[0].dtype == "float32"]
    # no float32 bucket was all-reduced
    if not ops:
        return
    total = sum(op_bytes(op) for op in ops)
    hook = HOOKS[dtype]
    yield registered(CODE).finding(
        message=(
            f"DDP all-reduces {fmt_bytes(total)} of float32 gradients per step in {len(ops)} "
            f"bucket{'s' if len(ops) > 1 else ''} while the step computes under {dtype} autocast; {hook} sends "
            f"{fmt_bytes(total // 2)}."
        ),
        fix_title=f"Register DDP's {hook}: model.register_comm_hook(None, default_hooks.{hook})",
        receipts=(
            model_call_receipt(
                capture,
                op="c10d.allreduce_ (DDP buckets)",
                shapes=f"{len(ops)} bucket{'s' if len(ops) > 1 else ''}, float32",
                count=len(ops),
            ),
        ),
        severity="medium",
        effort="S",
        risk="medium",
        lever=None,
        details={"allreduce_bytes": total, "compressed_bytes": total // 2, "hook": hook},
    )
