"""ELEM001 memory-bound-elementwise: an eager step whose time goes to small memory-bound kernels.

## What it does
Sums the time of the step's elementwise kernels (activations, residual adds, casts, masks: every
op the bottleneck classifies as `elementwise`, see the audit's bottleneck section), with their
launches, and fires when they take at least 15% of the step. Kernels that a more specific rule
reports are that rule's alone: hand-written norms (NORM001), SwiGLU (FUSE001) and rotate-half
RoPE (FUSE002), with their backward, are left out, and so are norms that already run as one
fused kernel (`F.layer_norm`, `F.rms_norm`). It prices what regional compilation would leave:
each run of consecutive elementwise ops of one repeated block in one phase becomes one kernel
that moves the bytes of the largest op of the run; runs outside the repeated blocks stay as
they are.

The message splits the time as the bottleneck's op-class table does. On a CPU capture it gives
the kernels' roofline time (part of the table's `elementwise` row) and their launch overhead
(part of its `launch-and-idle` row) separately; on a GPU capture it gives their device time.

## Why is this bad?
In eager mode every elementwise op is its own kernel that reads and writes whole activations
from HBM. Between two matmuls a transformer block runs tens of them (norm, RoPE, SwiGLU,
residual adds, casts), each memory-bound and each paying a launch. A fusing compiler (or fused
kernels) keeps the intermediates in registers: one read, one write, one launch per region. On
the `hf` llama at size 1b on an H200 this is the largest lever measured (150.8 ms to 99.8 ms per
step with each decoder layer compiled).

## Example
```python
model = AutoModelForCausalLM.from_config(config)
loss = model(input_ids=ids, labels=ids).loss  # eager: ~20 elementwise kernels per layer
```

Use instead:
```python
for layer in model.model.layers:
    layer.compile()  # regional compile: one graph per block, compiled once, reused
loss = model(input_ids=ids, labels=ids).loss
```

## Fix
Regional `torch.compile` of each repeated block (lever `compile-blocks`), or fused kernels for
the known chains (lever `liger-kernels`: RoPE, SwiGLU, RMSNorm). Not both at once on a Hugging
Face llama: torch.compile over a Liger-patched model fails in dynamo on torch 2.11. The whole
model compiled at once (lever `compile-model`) fuses the same runs and those between blocks.

## Fix safety
Changes numerics: fused kernels keep intermediates in fp32 registers and reorder reductions;
losses agree to rounding, not bitwise.

## Known problems
It does not fire on a model without repeated blocks (no run of elementwise ops inside one),
where the fix would not apply. The kernels of NORM001's, FUSE001's and FUSE002's patterns are
left out even when those rules are not selected: select them to see those kernels. The fixed
time is a coarse model of what a compiler fuses (a run of elementwise ops in one block and
phase, moving its largest op's bytes); compiled code also removes launch gaps that no kernel
time shows. A capture of an already compiled region records its ops eagerly, so the rule cannot
tell that a step is compiled; do not audit a compiled model with it.

## References
- https://pytorch.org/tutorials/recipes/regional_compilation.html
- https://github.com/linkedin/Liger-Kernel
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator

from levers.capture.records import Capture
from levers.audit.activations import block_of, group_of
from levers.audit.bottleneck import ELEMENTWISE, NORMS, classify_ops
from levers.audit.config import RuleConfig
from levers.audit.cost import roofline
from levers.audit.finding import Finding, Part, Work
from levers.audit.pattern_view import pattern_view
from levers.audit.patterns import fmt_bytes, receipt, with_backward
from levers.audit.rules.registry import registered, rule
from levers.units import format_us
from levers.vocab import CHANGES_NUMERICS

CODE, NAME = "ELEM001", "memory-bound-elementwise"
# elementwise kernels must take at least this share of the step
MIN_STEP_SHARE = 0.15
NUM_RECEIPTS = 3
LEVERS = ("compile-blocks", "liger-kernels", "compile-model")


@rule(CODE, NAME, severity="medium", fix_safety=CHANGES_NUMERICS, levers=LEVERS)
def check(capture: Capture, config: RuleConfig) -> Iterator[Finding]:
    classes = classify_ops(capture)
    ops = capture.ops
    claimed_by = claimed_elsewhere(capture)
    claimed = frozenset().union(*claimed_by.values())
    elementwise = [
        op for op, cls in zip(ops, classes)
        if cls == ELEMENTWISE and not op.is_view and op.phase != "optimizer"
        and op.index not in claimed
    ]
    # nothing elementwise launches a kernel that no more specific rule reports
    if not elementwise:
        return
    tf32 = bool(capture.settings.get("cuda_matmul_allow_tf32"))
    now_us = roofline.ops_us(elementwise, config.gpu, assumed_dtype=config.assumed_dtype, tf32=tf32)
    step_us = roofline.ops_us(ops, config.gpu, assumed_dtype=config.assumed_dtype, tf32=tf32)
    measured = config.on_gpu and any(op.device_us is not None for op in ops)
    if measured:
        now_us = sum(op.device_us or 0.0 for op in elementwise)
        step_us = capture.timing.median_s * 1e6
    # small share of the step: fusion would not change much
    if step_us <= 0 or now_us < MIN_STEP_SHARE * step_us:
        return
    runs = _runs(capture, classes, claimed)
    # no repeated block holds a run: a regional compile (and Liger's per-block kernels) has
    # nothing to fuse, so the fix would not apply to this model and would save nothing
    if not runs:
        return
    fused = tuple(_fused_part(capture, run, config) for run in runs)
    unfused = tuple(
        roofline.op_part(ops[i], assumed_dtype=config.assumed_dtype, tf32=tf32)
        for i in sorted({op.index for op in elementwise} - {i for run in runs for i in run})
    )
    by_line: dict[tuple[str, int], float] = defaultdict(float)
    for op in elementwise:
        # the lead is the model's own work: ops outside its modules (a batch assembled on the
        # host) are not what compiling its blocks fuses
        if op.source is not None and op.phase == "forward" and op.module is not None:
            by_line[(op.source.file, op.source.line)] += roofline.part_us(
                roofline.op_part(op, assumed_dtype=config.assumed_dtype, tf32=tf32), config.gpu
            )
    top = sorted(by_line.items(), key=lambda kv: (-kv[1], kv[0]))[:NUM_RECEIPTS]
    first_at = {}
    for op in elementwise:
        if op.source is not None:
            first_at.setdefault((op.source.file, op.source.line), op)
    receipts = tuple(
        receipt(
            first_at[key].source,
            module=group_of(first_at[key].module),
            op=first_at[key].name.split(".")[1] if "." in first_at[key].name else first_at[key].name,
            shapes=f"~{us:.3g} us of elementwise kernels per step from this line (forward)",
        )
        for key, us in top
    ) or (receipt(elementwise[0].source, module=None, op="", shapes=""),)
    num_kernels = len(elementwise)
    moved = sum(op.read_bytes + op.write_bytes for op in elementwise)
    share = now_us / step_us
    # the bottleneck's accounting: on a CPU capture a kernel's roofline time is its class's and
    # its launch overhead is launch-and-idle's; on a GPU capture device time is the kernel's
    launch_us = 0.0 if measured else num_kernels * roofline.KERNEL_OVERHEAD_US
    kernel_us = now_us - launch_us
    if measured:
        time_text = f"{format_us(kernel_us)} of device time, {share:.0%} of the step"
    else:
        time_text = (
            f"{format_us(kernel_us)} of kernel time (part of the op-class table's elementwise "
            f"row) and {format_us(launch_us)} of launches at {roofline.KERNEL_OVERHEAD_US:g} µs "
            f"each (part of its launch-and-idle row), together {share:.0%} of the estimated step"
        )
    left_out = _left_out_text(capture, classes, claimed_by)
    message = (
        f"{num_kernels} elementwise kernels per step (forward and backward) move "
        f"{fmt_bytes(moved)}: {time_text}{left_out}. {len(runs)} runs of them sit inside "
        f"repeated blocks, where a regional compile fuses each run into one kernel."
    )
    yield registered(CODE).finding(
        message=message,
        fix_title="Compile each repeated block (regional torch.compile), or use fused kernels for "
        "its chains",
        receipts=receipts,
        severity="high" if share >= 2 * MIN_STEP_SHARE else "medium",
        effort="S",
        risk="medium",
        work=Work(
            fixed=fused + unfused,
            now_ops=tuple(op.index for op in elementwise),
        ),
        details={
            "levers": list(LEVERS),
            "num_kernels": num_kernels,
            "bytes": moved,
            "step_share": share,
            "kernel_us": kernel_us,
            "launch_us": launch_us,
            "num_fused_runs": len(runs),
        },
    )


def claimed_elsewhere(capture: Capture) -> dict[str, frozenset[int]]:
    """Ops whose kernels a more specific rule reports, with their backward, by that rule's code:
    hand-written norms (NORM001), gated activations (FUSE001) and rotate-half RoPE (FUSE002)."""
    view = pattern_view(capture)
    patterns = {
        "NORM001": view.unfused_norms,
        "FUSE001": view.gated_activations,
        "FUSE002": view.unfused_rope,
    }
    return {
        code: frozenset(with_backward((i for c in chains for i in c.ops), view.backward))
        for code, chains in patterns.items()
        if chains
    }


def _left_out_text(
    capture: Capture, classes: tuple[str, ...], claimed: dict[str, frozenset[int]]
) -> str:
    """What the count leaves out, so that it reads against the op-class table and the other
    findings."""
    ops = capture.ops
    claimed_ops = frozenset().union(*claimed.values())
    parts = [
        f"{sum(1 for i in indices if not ops[i].is_view)} kernels of {_PATTERN_NAMES[code]} are "
        f"{code}'s"
        for code, indices in claimed.items()
    ]
    num_norms = sum(
        1 for op, cls in zip(ops, classes)
        if cls == NORMS and not op.is_view and op.index not in claimed_ops
    )
    if num_norms:
        parts.append(f"{num_norms} kernels of fused norms already run as one kernel per call")
    return f" ({'; '.join(parts)})" if parts else ""


_PATTERN_NAMES = {
    "NORM001": "hand-written norms",
    "FUSE001": "gated activations",
    "FUSE002": "rotate-half RoPE",
}


def _runs(
    capture: Capture, classes: tuple[str, ...], claimed: frozenset[int]
) -> list[tuple[int, ...]]:
    """Consecutive elementwise ops of one repeated block and phase. Views, norms and the ops
    another rule reports are not part of a run and do not break it: a compiler fuses across
    them, and their own kernels are priced by their rule."""
    runs: list[tuple[int, ...]] = []
    current: list[int] = []
    key = None
    for op, cls in zip(capture.ops, classes):
        if op.is_view or op.index in claimed or cls == NORMS:
            continue
        block = block_of(op.module)
        op_key = (block, op.phase)
        if cls == ELEMENTWISE and block is not None and op.phase != "optimizer":
            if op_key != key and current:
                runs.append(tuple(current))
                current = []
            current.append(op.index)
            key = op_key
        else:
            if current:
                runs.append(tuple(current))
            current, key = [], None
    if current:
        runs.append(tuple(current))
    return runs


def _fused_part(capture: Capture, run: tuple[int, ...], config: RuleConfig) -> Part:
    parts = [
        roofline.op_part(capture.ops[i], assumed_dtype=config.assumed_dtype, tf32=False)
        for i in run
    ]
    return Part(label="fused elementwise run", bytes=max(p.bytes for p in parts), num_kernels=1)
