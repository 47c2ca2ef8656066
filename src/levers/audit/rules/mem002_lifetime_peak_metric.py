"""MEM002 lifetime-peak-metric: a peak-memory metric read without ever resetting the peak.

## What it does
Finds reads of `torch.cuda.max_memory_allocated` / `max_memory_reserved` in the step when no
`reset_peak_memory_stats` (or `reset_max_memory_allocated`) call ran in the step and none
appears in the function that reads the metric. On a CPU capture the function is parsed, since a
reset guarded by `torch.cuda.is_available()` does not run there: a reset counts unless a guard
around it is false on a GPU (guards are evaluated statically, with the function's globals and
closure when the audit still holds the workload).

## Why is this bad?
The CUDA allocator's peak is a lifetime maximum: one long batch raises it for the rest of the
run, so a logged "peak" only ratchets upwards and memory "creep" cannot be told apart from one
outlier. A per-window peak answers the question the metric is read for.

## Example
```python
metrics["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
```

Use instead:
```python
metrics["window_peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
torch.cuda.reset_peak_memory_stats()  # start the next window; keep a lifetime max in Python
```

## Fix
Reset the peak once per logging window and keep the lifetime maximum in Python (lever
`windowed-peak-metric`).

## Fix safety
Exact: training is unaffected; only the metric's meaning changes (log both during the switch).

## Known problems
A reset in another function or module (a logging hook) is not seen by the static check; the
finding then names the read that looks unreset. A guard the static check cannot evaluate (a
call, a data-dependent test) counts as taken.

## References
- https://pytorch.org/docs/stable/generated/torch.cuda.max_memory_allocated.html
- https://pytorch.org/docs/stable/generated/torch.cuda.reset_peak_memory_stats.html
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from levers.capture.records import CallRecord, Capture
from levers.audit.config import RuleConfig
from levers.audit.finding import AlreadyRight, Finding, Work
from levers.audit.patterns import group_by_source, module_pattern, receipt
from levers.audit.peak_metric_source import RESET_NAMES, reset_in_source
from levers.audit.rules.registry import registered, rule
from levers.vocab import EXACT

CODE, NAME = "MEM002", "lifetime-peak-metric"
PEAK_READS = ("torch.cuda.max_memory_allocated", "torch.cuda.max_memory_reserved")


def reset_for(call: CallRecord, capture: Capture, config: RuleConfig) -> str | None:
    """Where the peak is reset for this read ("in the step" or "file:line"), or None.

    A GPU capture records every reset that ran, so it alone decides; a CPU capture runs no CUDA
    code, so the function around the read is also read for a reset reachable on a GPU.
    """
    resets = [
        c
        for c in capture.calls
        if c.kind == "memory_metric" and c.name.split(".")[-1] in RESET_NAMES
    ]
    if resets:
        return "reset_peak_memory_stats ran in the step"
    if config.on_gpu or call.source is None:
        return None
    line = reset_in_source(call.source.file, call.source.line, config.scopes)
    return (
        None
        if line is None
        else f"reset_peak_memory_stats at {os.path.basename(call.source.file)}:{line}"
    )


def already_right(capture: Capture, config: RuleConfig) -> AlreadyRight | None:
    """Peak-memory reads whose peak is reset each window."""
    reads = [
        c for c in capture.calls if c.kind == "memory_metric" and c.name in PEAK_READS
    ]
    if not reads:
        return None
    where = [reset_for(c, capture, config) for c in reads]
    if any(w is None for w in where):
        return None
    return AlreadyRight(
        "MEM002", "windowed peak metric", f"the peak is reset: {where[0]}"
    )


@rule(
    CODE, NAME, severity="low", fix_safety=EXACT, levers=("windowed-peak-metric",),
    already_right=(already_right,),
)
def check(capture: Capture, config: RuleConfig) -> Iterator[Finding]:
    reads = [
        c for c in capture.calls if c.kind == "memory_metric" and c.name in PEAK_READS
    ]
    # the step reads no peak metric
    if not reads:
        return
    for group in group_by_source(reads, lambda c: c.source).values():
        # the peak is reset in the step or in the reading function: a windowed metric
        if reset_for(group[0], capture, config) is not None:
            continue
        yield _finding(group)


def _finding(group: list[CallRecord]) -> Finding:
    call = group[0]
    return registered(CODE).finding(
        message=(
            f"{call.name}() is read {len(group)}x per step and the peak is never reset "
            "(no reset_peak_memory_stats in the step or in this function): it is a lifetime "
            "ratchet, not this window's peak."
        ),
        fix_title="Call torch.cuda.reset_peak_memory_stats() once per logging window; keep the lifetime max in Python",
        receipts=(
            receipt(
                call.source,
                module=module_pattern([call.module]),
                op=call.name,
                shapes="",
                count=len(group),
            ),
        ),
        effort="S",
        risk="low",
        work=Work(),
        details={"reads": len(group)},
    )
