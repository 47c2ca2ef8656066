"""ELEM001 memory-bound-elementwise: an eager step whose time goes to small memory-bound kernels.

## What it does
Sums the time of the step's elementwise and norm kernels (activations, residual adds, casts,
RoPE, hand-written norms: every op the bottleneck classifies as `elementwise` or `norms`, see
the audit's bottleneck section), with their launches, and fires when they take at least 15% of
the step. It prices what regional compilation would leave: each run of consecutive elementwise
ops of one repeated block in one phase becomes one kernel that moves the bytes of the largest op
of the run; runs outside the repeated blocks stay as they are.

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
where the fix would not apply. The fixed time is a coarse model of what a compiler fuses (a run of elementwise ops in one
block and phase, moving its largest op's bytes); compiled code also removes launch gaps that no
kernel time shows. A capture of an already compiled region records its ops eagerly, so the rule
cannot tell that a step is compiled; do not audit a compiled model with it.

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
from levers.audit.patterns import fmt_bytes, receipt
from levers.audit.rules.registry import registered, rule
from levers.vocab import CHANGES_NUMERICS

CODE, NAME = "ELEM001", "memory-bound-elementwise"
# elementwise and norm kernels must take at least this share of the step
MIN_STEP_SHARE = 0.15
NUM_RECEIPTS = 3
LEVERS = ("compile-blocks", "liger-kernels", "compile-model")


@rule(CODE, NAME, severity="medium", fix_safety=CHANGES_NUMERICS, levers=LEVERS)
def check(capture: Capture, config: RuleConfig) -> Iterator[Finding]:
    classes = classify_ops(capture)
    ops = capture.ops
    elementwise = [
        op for op, cls in zip(ops, classes)
        if cls in (ELEMENTWISE, NORMS) and not op.is_view and op.phase != "optimizer"
    ]
    # nothing elementwise launches a kernel
    if not elementwise:
        return
    tf32 = bool(capture.settings.get("cuda_matmul_allow_tf32"))
    now_us = roofline.ops_us(elementwise, config.gpu, assumed_dtype=config.assumed_dtype, tf32=tf32)
    step_us = roofline.ops_us(ops, config.gpu, assumed_dtype=config.assumed_dtype, tf32=tf32)
    if config.on_gpu and any(op.device_us is not None for op in ops):
        now_us = sum(op.device_us or 0.0 for op in elementwise)
        step_us = capture.timing.median_s * 1e6
    # small share of the step: fusion would not change much
    if step_us <= 0 or now_us < MIN_STEP_SHARE * step_us:
        return
    runs = _runs(capture, classes)
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
    message = (
        f"{num_kernels} elementwise and norm kernels per step (forward and backward) move "
        f"{fmt_bytes(moved)} and take {share:.0%} of the step; {len(runs)} runs of them sit inside "
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
            "num_fused_runs": len(runs),
        },
    )


def _runs(capture: Capture, classes: tuple[str, ...]) -> list[tuple[int, ...]]:
    """Consecutive elementwise ops of one repeated block and phase (views do not break a run)."""
    runs: list[tuple[int, ...]] = []
    current: list[int] = []
    key = None
    for op, cls in zip(capture.ops, classes):
        if op.is_view:
            continue
        block = block_of(op.module)
        op_key = (block, op.phase)
        if cls in (ELEMENTWISE, NORMS) and block is not None and op.phase != "optimizer":
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
