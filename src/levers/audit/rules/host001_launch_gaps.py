"""HOST001 launch-gaps: a GPU step that spends much of its time between kernels, not in them.

## What it does
Reads the idle time of a GPU capture's step: the measured step time minus the time some kernel
was running (launch gaps, host work between launches, syncs). It is the bottleneck's
`launch-and-idle` class, except that where the capture has the kernels' timeline the kernels no
op launched (a CUDA graph's replay) count as busy and overlapping kernels count once. When that is at least 10% of the step it reports the
share, the milliseconds per step, the number of kernels launched per step and, when the capture
has the kernels' start times, the mean idle gap between one kernel's end and the next one's
start. It names `compile-model`, whose CUDA graphs
(`mode="reduce-overhead"`, what its `mode=auto` picks on a static step) replay the step's
kernels with one launch, and says why CUDA graphs cannot apply when the capture shows it:
host-device syncs in the step (the calls SYNC001 reports) or input shapes that change across
steps (dynamo recompiled the step's compiled code on a tensor size guard before the capture).
On a mixture of experts (tokens routed by data-dependent indices) it says the graphs apply to
part of the step: inductor's CUDA graphs skip what they cannot capture, so compile-model with
`mode="reduce-overhead"` asked by name (its `mode=auto` compiles such a step without graphs).

## Why is this bad?
A kernel launch costs the host several microseconds; when the kernels are short (a ViT-B/16 at
batch 64 on an H200: 16% of the step in launch and idle gaps) the host cannot queue them faster
than the GPU runs them, and the GPU waits. A faster GPU makes the share larger, not smaller.
A CUDA graph records the step's kernels once and replays them with one launch, so the host cost
per kernel disappears.

## Example
```python
model = timm.create_model("vit_base_patch16_224")
loss = F.cross_entropy(model(images), labels)  # each of the step's kernels launched from Python
```

Use instead:
```python
model.compile(mode="reduce-overhead")          # or: levers.apply(model, "compile-model")
torch.compiler.cudagraph_mark_step_begin()     # each step, before the forward
loss = F.cross_entropy(model(images), labels).clone()
```

## Fix
`compile-model`: the whole model compiled, with CUDA graphs (`reduce-overhead`) where the step
is static; its undo says which mode it chose and why. When the finding lists reasons CUDA
graphs cannot apply, remove them first (the syncs SYNC001 lists; fixed shapes, padded to a
bucket). On a mixture of experts, compile-model with `mode="reduce-overhead"` by name replays
the parts a graph can capture (on the zoo's mixtral on an H100, 1.77x eager against the default
mode's 1.68x, `bench/results/tune_sweep_h100/s51`); `levers tune` tries it beside the default
mode there.
On a step compiled already (compile-model refuses it) the finding says to pass
`mode="reduce-overhead"` to that compile instead.

## Fix safety
Changes numerics: compile-model's inductor fuses and reorders elementwise work (tolerance 1e-5
relative in fp32). CUDA graphs themselves replay the same kernels.

## Known problems
The cost is an estimate of what CUDA graphs can recover at most: the whole launch-and-idle time
(host work a graph does not remove, such as drawing the batch, stays). With a reason listed the
rule claims no saving and names no lever (the fix title still names compile-model, for once the
reasons are gone): a sync outside the model's forward (a `loss.item()` in the step function)
does not stop compile-model from replaying the model, so there the rule is conservative and
`levers ab WORKLOAD --lever compile-model` measures it.
Varying input shapes are seen only through dynamo's recompiles, so on an uncompiled step (one
step is captured) they are not seen. It does not fire on a CPU capture: there
`launch-and-idle` is the roofline's per-kernel overhead, an estimate, not a gap that was seen.

## References
- https://pytorch.org/blog/accelerating-pytorch-with-cuda-graphs/
- https://docs.pytorch.org/docs/stable/generated/torch.compile.html (mode="reduce-overhead")
- https://docs.pytorch.org/docs/stable/torch.compiler_cudagraph_trees.html
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from levers.audit.bottleneck import LAUNCH, Bottleneck, moe_modules, step_bottleneck
from levers.audit.config import RuleConfig
from levers.audit.finding import Finding, Work
from levers.audit.patterns import receipt
from levers.audit.rules.registry import registered, rule
from levers.audit.rules.sync001_host_device_sync import is_real_sync
from levers.capture.records import Capture, KernelRecord
from levers.units import format_ms, format_share, format_us
from levers.vocab import CHANGES_NUMERICS, MEASURED

CODE, NAME = "HOST001", "launch-gaps"
# A tenth of the step: below it CUDA graphs' own costs (the batch copied into the graph's static
# buffers each step, the memory pool, a recording per new shape) and the whole-model compile take
# most of the gain; issue 21's ViT-B/16 at batch 64 on an H200 shows 16%.
MIN_SHARE = 0.10
# a quarter of the step or more spent waiting on the host: high severity
HIGH_SHARE = 0.25
# the words dynamo writes in a guard that failed on a tensor's size ("tensor 'x' size mismatch at
# index 0. expected 4, actual 8")
SIZE_GUARDS = ("size mismatch", "size(", ".size()")


def busy_us(kernels: tuple[KernelRecord, ...]) -> float | None:
    """The time some kernel was running: the union of the kernels' intervals (overlaps once);
    None without start times (a capture written before levers recorded them)."""
    if not kernels or any(k.start_us is None for k in kernels):
        return None
    total_us, end_us = 0.0, float("-inf")
    for k in sorted(kernels, key=lambda k: k.start_us):
        start_us = max(k.start_us, end_us)
        total_us += max(k.start_us + k.device_us - start_us, 0.0)
        end_us = max(end_us, k.start_us + k.device_us)
    return total_us


def idle_ms(capture: Capture, b: Bottleneck) -> float:
    """The step's time outside every kernel: from the kernels' timeline when the capture has it
    (kernels no op launched count as busy), else the bottleneck's launch-and-idle time."""
    busy = busy_us(capture.kernels)
    if busy is None:
        return b.of(LAUNCH).time_ms
    return max(b.step_ms - busy / 1e3, 0.0)


def mean_gap_us(kernels: tuple[KernelRecord, ...]) -> float | None:
    """The mean idle time between one kernel's end and the next one's start on the device (kernels
    that overlap count no gap); None without start times or with fewer than two kernels."""
    timed = sorted((k for k in kernels if k.start_us is not None), key=lambda k: k.start_us)
    if len(timed) < 2:
        return None
    idle_us, end_us = 0.0, timed[0].start_us + timed[0].device_us
    for k in timed[1:]:
        idle_us += max(k.start_us - end_us, 0.0)
        end_us = max(end_us, k.start_us + k.device_us)
    return idle_us / (len(timed) - 1)


def partly_graphed(capture: Capture) -> str | None:
    """Why CUDA graphs can replay only part of this step (a mixture of experts), or None."""
    experts, _ = moe_modules(capture.modules)
    if not experts:
        return None
    return (
        f"{experts[0]} is a mixture of experts: tokens are routed by data-dependent indices "
        "(nonzero, where), which a CUDA graph cannot capture, so inductor's graphs skip those "
        "parts and replay the rest"
    )


def graph_reasons(capture: Capture) -> list[str]:
    """Why CUDA graphs cannot replay this step, as far as the capture shows (empty: none seen)."""
    reasons = []
    syncs = [c for c in capture.calls if c.kind == "sync" and is_real_sync(c, on_gpu=True)]
    if syncs:
        where = syncs[0].source
        at = f" (the first at {where.file.rsplit('/', 1)[-1]}:{where.line})" if where else ""
        reasons.append(
            f"{len(syncs)} host-device sync{'s' if len(syncs) != 1 else ''} per step{at}: a "
            "graph cannot hold a sync, and the host waits at each one (SYNC001 lists them)"
        )
    for entry in (capture.settings.get("compile") or {}).get("recompiles") or []:
        guard = next(
            (r for r in entry.get("reasons") or () if any(m in r for m in SIZE_GUARDS)), None
        )
        if guard is not None:
            reasons.append(
                f"input shapes change across steps: dynamo recompiled {entry['function']} on a "
                f"size guard ({guard.split(': ', 1)[-1]}), and CUDA graphs record one graph per "
                "shape"
            )
            break
    return reasons


@rule(CODE, NAME, severity="medium", fix_safety=CHANGES_NUMERICS, levers=("compile-model",))
def check(capture: Capture, config: RuleConfig) -> Iterator[Finding]:
    # on a CPU capture launch-and-idle is the roofline's per-kernel overhead, not a measured gap
    if not config.on_gpu:
        return
    b = step_bottleneck(capture, config)
    # a GPU capture without device time joined to its ops: no gap was measured
    if b.provenance != MEASURED:
        return
    gap_ms = idle_ms(capture, b)
    share = gap_ms / b.step_ms if b.step_ms > 0 else 0.0
    # the gaps are a small part of the step
    if share < MIN_SHARE:
        return
    num_kernels = len(capture.kernels)
    mean_us = mean_gap_us(capture.kernels)
    reasons = graph_reasons(capture)
    kernels = f"{num_kernels} kernels launched per step" if num_kernels else "kernels not recorded"
    if mean_us is not None:
        kernels += f", {format_us(mean_us)} idle between one kernel and the next on average"
    message = (
        f"{format_share(share)} of the step ({format_ms(gap_ms)} of "
        f"{format_ms(b.step_ms)}, measured) is launch and idle time, outside every kernel "
        f"({kernels}): the GPU waits for the host"
    )
    partly = partly_graphed(capture)
    if reasons:
        fix_title = (
            f"CUDA graphs cannot apply now: {'; '.join(reasons)}. Remove what keeps them off, "
            "then replay the step as CUDA graphs (compile-model, mode=reduce-overhead)"
        )
    elif partly:
        fix_title = (
            f"Replay what CUDA graphs can capture: compile-model with mode=reduce-overhead asked "
            f"by name ({partly}; its mode=auto compiles such a step without graphs). On the "
            "zoo's mixtral (H100) that ran 1.77x eager where the default mode ran 1.68x"
        )
    else:
        fix_title = (
            "Replay the step as CUDA graphs: compile the whole model with mode=reduce-overhead "
            "(compile-model; its mode=auto picks it on a static step)"
        )
    if (capture.settings.get("compile") or {}).get("frames_compiled"):
        # compile-model refuses a model compiled already: say how to reach the same mode
        fix_title += (
            "; the step is compiled already: pass mode=\"reduce-overhead\" to that torch.compile, "
            "or remove it and apply compile-model"
        )
    # the step's first op with a user source line: where the step starts launching kernels
    first = next((op for op in capture.ops if op.source is not None), None)
    details: dict[str, Any] = {
        "launch_and_idle_share": share,
        "launch_and_idle_ms": gap_ms,
        "step_ms": b.step_ms,
        "num_kernels": num_kernels,
        "mean_gap_us": mean_us,
        "cuda_graph_reasons": reasons,
        "cuda_graphs_partly": partly,
    }
    if reasons:
        details["recommended"] = False
    yield registered(CODE).finding(
        message=message,
        fix_title=fix_title,
        receipts=(
            receipt(
                first.source if first is not None else None,
                module=None,
                op=f"launch-and-idle {format_share(share)} of the step",
                shapes=f"{num_kernels} kernels per step" if num_kernels else "",
            ),
        ),
        severity="high" if share >= HIGH_SHARE else "medium",
        effort="M" if reasons else "S",
        # graphs over part of a step: a module that keeps a graph's output may break them
        risk="medium" if reasons or partly else "low",
        # with a reason the first fix is in the code: no lever is recommended, and none is given a
        # zero saving that would rank it last in levers tune (compile-model may still pay by
        # fusing, which other findings and the catalogue say)
        lever=None if reasons else "compile-model",
        work=Work(
            # with a reason listed nothing is claimed recovered
            fixed_fraction_of_now=1.0 if reasons else 0.0,
            bench={"kind": "launch_gaps", "gap_us": gap_ms * 1e3, "reasons": reasons,
                   "partly": partly is not None},
        ),
        details=details,
    )
