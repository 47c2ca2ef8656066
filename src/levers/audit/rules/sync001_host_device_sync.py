"""SYNC001 host-device-sync: ops that make the host wait for the GPU, by source line.

## What it does
Reports every call in the step that forces a device-to-host synchronisation (`.item()`,
`bool()`/`int()`/`float()` of a tensor, `.tolist()`, `.cpu()`, `nonzero`, boolean-mask
indexing, `masked_select`, `unique`, `repeat_interleave` without `output_size`, ...), one
finding per source line with its count per step.

Calls made by torch's own code are skipped on a CPU capture: they read host-side state that stays
on the host on a GPU too (a non-capturable optimizer's step counter is a CPU tensor, so its
`.item()` waits for nothing). On a GPU capture they are reported when the tensor is on the GPU,
attributed to the user line that called into torch. A sync on a CPU tensor in a GPU step is not
a sync and is skipped.

## Why is this bad?
The host queues kernels ahead of the GPU; a sync drains that queue, so the GPU idles while the
host catches up after each one. Syncs also break CUDA graphs and are graph breaks under
`torch.compile`.

## Example
```python
num_image_tokens = int(is_patch.sum())
if bool(is_extension.any()):
    ...
loss = per_token[targets != IGNORE_INDEX].sum()
```

Use instead:
```python
num_image_tokens = layout.num_image_tokens  # known on the host
# compute both paths and select with torch.where
loss = (per_token * (targets != IGNORE_INDEX)).sum()
```

## Fix
A code change at each line (no lever): keep host-known values on the host, replace branches on
device values with `torch.where`, replace boolean indexing with a mask multiply or
`index_select` with indices built on the host, pass `output_size=` to `repeat_interleave`, and
move logging reads out of the step.

## Fix safety
Exact where the replacement computes the same values (a mask multiply where masked rows are
already zero, host-known counts); otherwise changes numerics only by summation order.

## Known problems
On a CPU capture every tensor is on the CPU, so a user call on a tensor that would stay on the
host on a GPU is still reported. The per-sync cost is an estimate (about one launch latency of
idle GPU per sync); the real cost depends on how far ahead the host was. One step is captured:
a sync that a script's loop makes on some steps only (a log line's `loss.item()` every N steps)
is missed when the captured step is not one of them, so "already right" says "no host-device
syncs in the captured step", never of the whole run.

## References
- https://pytorch.org/docs/stable/generated/torch.cuda.set_sync_debug_mode.html
- https://pytorch.org/docs/stable/notes/cuda.html#asynchronous-execution
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from levers.capture.records import CallRecord, Capture
from levers.audit.config import RuleConfig
from levers.audit.finding import AlreadyRight, Finding, Part, Work
from levers.audit.patterns import (
    group_by_source,
    meta_text,
    module_pattern,
    receipt,
)
from levers.audit.rules.registry import registered, rule
from levers.audit.script_step import script_command
from levers.vocab import EXACT

CODE, NAME = "SYNC001", "host-device-sync"
# The GPU idles while the host catches up after a sync: about one kernel launch latency.
SYNC_STALL_US = 20.0

_FIXES = {
    "Tensor.__bool__": "Do not branch on a device value: compute both paths and select with torch.where, or decide on the host",
    "Tensor.__int__": "Keep the value on the device, or take it from host-side data that already knows it",
    "Tensor.__float__": "Keep the value on the device, or take it from host-side data that already knows it",
    "Tensor.__index__": "Keep the value on the device, or take it from host-side data that already knows it",
    "Tensor.item": "Keep the value on the device, or read it outside the step (every N steps, asynchronously)",
    "Tensor.__getitem__": "Replace boolean-mask indexing with a mask multiply (exact when masked rows are zero) or index_select with host-built indices",
    "Tensor.__setitem__": "Replace the boolean-mask assignment with torch.where",
    "Tensor.tolist": "Read the values outside the step (every N steps, asynchronously)",
    "Tensor.cpu": "Copy to the host outside the step, or with non_blocking=True into pinned memory",
    "Tensor.numpy": "Copy to the host outside the step",
    "Tensor.to": "Copy to the host outside the step, or with non_blocking=True into pinned memory",
    "Tensor.nonzero": "Use a fixed-size form (torch.nonzero_static) or a mask",
    "torch.nonzero": "Use a fixed-size form (torch.nonzero_static) or a mask",
    "torch.where": "Use the three-argument torch.where(cond, a, b), which does not sync",
    "Tensor.masked_select": "Use a mask multiply or index_select with host-built indices",
    "torch.masked_select": "Use a mask multiply or index_select with host-built indices",
    "Tensor.repeat_interleave": "Pass output_size= so the result size is known on the host",
    "torch.repeat_interleave": "Pass output_size= so the result size is known on the host",
}


def is_real_sync(call: CallRecord, on_gpu: bool) -> bool:
    """Whether a recorded sync call makes the host wait for a GPU."""
    device = str((call.args.get("tensor") or {}).get("device", ""))
    if call.args.get("in_data_pipeline", False):
        # a DataLoader making a batch (a Dataset's __getitem__): host tensors on any device
        return False
    if on_gpu:
        # a host tensor in a GPU step waits for nothing
        return device.startswith("cuda")
    # on a CPU capture torch's own calls read host-side state (an optimizer's step counter)
    return not call.args.get("caller_in_torch", False)


def already_right(capture: Capture, config: RuleConfig) -> AlreadyRight | None:
    """No call in the captured step that waits for the GPU."""
    syncs = [c for c in capture.calls if c.kind == "sync"]
    if any(is_real_sync(c, config.on_gpu) for c in syncs):
        return None
    # one step is what was seen: a loop may sync on some steps only (a log line's loss.item()
    # every N steps), so the claim is about the captured step, never the whole run
    detail = "no call in the captured step waits for the GPU"
    if syncs:
        detail += f" ({len(syncs)} reads of host-side state inside torch skipped)"
    if script_command(capture) is not None:
        detail += (
            "; one step of the script was captured, so a sync its loop makes on other steps "
            "only (a log line's loss.item() every N steps) is not seen here: check the loop"
        )
    return AlreadyRight("SYNC001", "no host-device syncs in the captured step", detail)


@rule(CODE, NAME, severity="medium", fix_safety=EXACT, already_right=(already_right,))
def check(capture: Capture, config: RuleConfig) -> Iterator[Finding]:
    syncs = [
        c for c in capture.calls if c.kind == "sync" and is_real_sync(c, config.on_gpu)
    ]
    # no host-device syncs in the step
    if not syncs:
        return
    skipped = sum(1 for c in capture.calls if c.kind == "sync") - len(syncs)
    for group in group_by_source(syncs, lambda c: c.source).values():
        yield _finding(group, config, skipped)


def _finding(group: list[CallRecord], config: RuleConfig, skipped: int) -> Finding:
    first = group[0]
    names = Counter(c.name for c in group)
    count = len(group)
    from_torch = sum(1 for c in group if c.args.get("caller_in_torch"))
    kinds = ", ".join(f"{name} x{n}" for name, n in sorted(names.items()))
    message = (
        f"{count} host-device sync{'s' if count > 1 else ''} per step here ({kinds}) on "
        f"{meta_text(first.args.get('tensor'))}"
        + (
            f", {from_torch} inside torch code called from this line"
            if from_torch
            else ""
        )
        + ": the host waits for the GPU to drain its queue each time."
    )
    main = names.most_common(1)[0][0]
    return registered(CODE).finding(
        message=message,
        fix_title=_FIXES.get(main, "Remove the device-to-host read from the step"),
        receipts=(
            receipt(
                first.source,
                module=module_pattern(c.module for c in group),
                op=", ".join(sorted(names)),
                shapes=meta_text(first.args.get("tensor")),
                count=count,
            ),
        ),
        effort="S",
        risk="low",
        # the cost of a sync is GPU idle time, priced as a launch latency per sync
        work=Work(
            now=(Part("GPU idle after sync", bytes=0, num_kernels=0),),
            fixed=(),
            now_ops=tuple(
                i
                for c in group
                if c.first_op is not None
                for i in range(c.first_op, c.last_op + 1)
            ),
            calls_per_step=count,
            bench={"kind": "sync_stall", "stall_us": SYNC_STALL_US * count},
        ),
        details={"calls": dict(names), "torch_internal_skipped": skipped},
    )
