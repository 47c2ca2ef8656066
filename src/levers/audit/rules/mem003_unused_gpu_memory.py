"""MEM003 unused-gpu-memory: the step leaves much of the GPU's memory free that a larger batch could use.

## What it does
Reads the memory model's prediction of the step on the GPU that ran (or the target): when the
step is throughput-bound (at least 10% of the usable memory free at the predicted reserved peak)
and levers memory's fit of the workload's batch parameter predicts a batch at least 25% larger
that still fits with the margin, it reports the free memory, the predicted fit, and the tokens/s
the larger batch is predicted to buy: the optimizer and the launch gaps (the step's fixed time,
from the bottleneck section) are paid once per step, so they shrink per token.

## Why is this bad?
Memory left free at the peak buys nothing. A larger batch amortises the per-step costs that do
not grow with the batch (the optimizer update, kernel launches, syncs) and gives the matmuls
larger shapes, which run nearer the GPU's peak.

## Example
```python
workload = build(size="1b", batch_size=4)   # 31 GiB reserved of 140 GiB usable
```

Use instead:
```python
workload = build(size="1b", batch_size=26)  # levers memory hf --set size=1b --fit batch_size
```

## Fix
Raise the batch to the predicted fit (lever `raise-batch`, which asks `levers memory --fit`),
then re-tune the learning rate, or keep the global batch and lower gradient accumulation.

## Fix safety
Changes numerics: a different batch changes the optimisation (gradient noise, steps per epoch);
keep the global batch fixed through gradient accumulation when results must not move.

## Known problems
The receipt is the step's first op with a user source line, usually where the batch is made.
The tokens/s model is first-order: everything but the optimizer and the launch gaps scales
linearly with the batch, so it ignores the better matmul efficiency at larger shapes (it
under-promises) and allocator fragmentation near the limit (the fit keeps a 5% margin). It needs
the workload's batch parameter (`batch_size`) and the memory model's fit; a step whose batch is
fixed in code is not searched.

## References
- https://pytorch.org/docs/stable/torch_cuda_memory.html
- McCandlish et al., An Empirical Model of Large-Batch Training (2018), https://arxiv.org/abs/1812.06162
"""

from __future__ import annotations

from collections.abc import Iterator

from levers.capture.records import Capture
from levers.audit.bottleneck import THROUGHPUT_BOUND, step_bottleneck, tokens_per_s_ratio
from levers.audit.config import RuleConfig
from levers.audit.finding import Finding, Work
from levers.audit.patterns import fmt_bytes, receipt
from levers.audit.rules.registry import registered, rule
from levers.vocab import CHANGES_NUMERICS

CODE, NAME = "MEM003", "unused-gpu-memory"
# the fit must be at least this much larger than the batch now
MIN_BATCH_GAIN = 1.25


@rule(CODE, NAME, severity="medium", fix_safety=CHANGES_NUMERICS, levers=("raise-batch",))
def check(capture: Capture, config: RuleConfig) -> Iterator[Finding]:
    memory = config.memory
    # no prediction, or no fit of the batch
    if memory is None or memory.batch_fit is None or not memory.batch_now:
        return
    b = step_bottleneck(capture, config)
    # memory binds: there is nothing to spend
    if b.bound != THROUGHPUT_BOUND:
        return
    # the fit is not meaningfully larger
    if memory.batch_fit < MIN_BATCH_GAIN * memory.batch_now:
        return
    now, fit = memory.batch_now, memory.batch_fit
    ratio = tokens_per_s_ratio(b, now, fit)
    fraction = 1.0 / ratio  # time per token at the fit over time per token now
    free = memory.usable_bytes - memory.peak_reserved_bytes
    message = (
        f"{fmt_bytes(free)} of {fmt_bytes(memory.usable_bytes)} usable on {memory.gpu} stay free at "
        f"the predicted {fmt_bytes(memory.peak_reserved_bytes)} reserved peak; levers memory's fit "
        f"predicts {memory.batch_param}={fit}"
        f"{f' or more ({memory.batch_fit_note})' if memory.batch_fit_note else ''} fits (budget {fmt_bytes(memory.fit_budget_bytes)}, "
        f"now {now}). The step's fixed time ({b.fixed_ms:.3g} ms of {b.step_ms:.3g} ms, "
        f"{b.provenance}: optimizer and launch gaps) is paid once per step, so {memory.batch_param}="
        f"{fit} is predicted at {ratio:.2f}x the tokens/s."
    )
    params = capture.workload_params
    # the step's first op with a user source line is usually where the batch is made
    first = next((op for op in capture.ops if op.source is not None), None)
    yield registered(CODE).finding(
        message=message,
        fix_title=f"Raise {memory.batch_param} from {now} to {fit} (the predicted fit), then "
        "re-tune the learning rate or lower gradient accumulation",
        receipts=(
            receipt(
                first.source if first is not None else None,
                module=None,
                op=f"{memory.batch_param}={params.get(memory.batch_param, now)}",
                shapes=f"predicted reserved peak {fmt_bytes(memory.peak_reserved_bytes)}",
            ),
        ),
        severity="medium" if ratio >= 1.05 else "low",
        effort="S",
        risk="medium",
        work=Work(
            now_ops=tuple(op.index for op in capture.ops),
            fixed_fraction_of_now=fraction,
        ),
        details={
            "levers": ["raise-batch"],
            "batch_param": memory.batch_param,
            "batch_now": now,
            "batch_fit": fit,
            "free_bytes": free,
            "tokens_per_s_ratio": ratio,
            "fixed_ms": b.fixed_ms,
            "step_ms": b.step_ms,
        },
    )
