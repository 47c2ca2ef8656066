"""DTYPE003 bf16-matmul-on-float8-gpu: large linears run bf16 matmuls on a GPU with float8 tensor cores.

## What it does
On a GPU of compute capability 8.9 or later (Ada, Hopper, Blackwell: L40S, H100, H200, B200),
the GPU that ran a GPU capture (its recorded capability) or the `--gpu` target of a CPU
capture, finds the matmuls (`mm`, `addmm`, forward and backward) of the `nn.Linear` modules
that the `float8` lever would convert, with the same filter: exactly `nn.Linear`; inputs in
bf16 or fp16 on the GPU (a CPU capture's fp32 as `--assume-dtype` says); K and N multiples of
16; not small by torchao's tensorwise thresholds (K <= 4096 and N <= 1024 is left); not the
output head (N equal to the vocabulary, the largest embedding seen in the step, or a linear
named `lm_head`, `output` or `head`). It fires when they are at least 30% of the step's GPU
time on a GPU capture, or at least 50% of the step's FLOPs on a CPU capture (the finding says
which), and not when the step already runs float8 matmuls (`_scaled_mm`, float8 tensors,
`Float8Linear` modules), which the report lists as already right. The three linears (module
paths, numbered children collapsed, with the same K and N) with the most time (GPU) or FLOPs
(CPU) are the receipts, with K, N, M and the dtype.

## Why is this bad?
These GPUs run float8 (e4m3) matmuls at twice their dense bf16 rate (about 1979 against 989
TFLOP/s on an H100 or H200). torchao's float8 training scales each operand and casts it to
float8 on the fly, so a linear's three matmuls (the forward and the backward's two) run at the
float8 rate, and the casts cost less than they save on large linears once compiled. On levers'
catalogue (the `hf` llama 1b on an H200, `bench/results/levers_vs_peers_float8_h200` and
`levers_vs_peers_goal_h200`): float8 with compile-blocks 1.04x over compile-blocks alone at
batch 4; with raise-batch, the float8 stack 2.15x the default (batch 58) against the bf16
stack's 1.74x (batch 45).

## Example
```python
with torch.autocast("cuda", dtype=torch.bfloat16):   # on an H100
    loss = model(input_ids, labels=labels).loss       # q/k/v/o and MLP linears in bf16
```

Use instead:
```python
levers.apply(model, "float8")          # torchao Float8Linear on the linears that pay
levers.apply(model, "compile-blocks")  # float8 pays only compiled
```

## Fix
`float8`: torchao's `convert_to_float8_training` on the linears above (tensorwise scales), with
compile-blocks or compile-model (eager, its scaling casts run as separate kernels and can cost
more than the faster matmuls save). `levers tune` also tries `float8-rowwise` beside it.

## Fix safety
Changes numerics: e4m3 keeps 3 mantissa bits (the backward's gradients e5m2, 2 bits) under
dynamic scales. A one-step parity does not prove it: the proof is `levers ab`'s held-out loss
read over a run.

## Known problems
The saving is an estimate, marked so: 7% of these matmuls' time (measured on a GPU capture, the
roofline's on a CPU one), the least float8 paid on levers' catalogue (1.04x over compile-blocks
at llama 1b batch 4 on an H200, where these linears take about 59 of the step's 98.6 ms by the
roofline: 4 ms saved); with larger batches it paid more (about a quarter of their time at batch
58). torchao's size filter ignores M (the tokens): with few tokens per step the casts weigh
more, which a GPU capture's time share sees and a CPU capture's FLOP share does not. The head is
found by its N and its name: a head tied to an embedding with another name and N is converted
by the lever but not seen here as a head. A step that compiles its linears away from the
capture's aten ops is not seen. `levers tune`'s claims A/B each lever alone, so float8 on an
eager step can read as not paying: prove it on top of a compile lever.

## References
- https://github.com/pytorch/ao/tree/main/torchao/float8
- https://github.com/pytorch/torchtitan/blob/main/docs/float8.md
- https://docs.nvidia.com/cuda/cublas/#cublasltmatmul (FP8 GEMMs)
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from levers.audit.bottleneck import step_bottleneck
from levers.audit.config import RuleConfig
from levers.audit.cost import roofline
from levers.audit.finding import AlreadyRight, Finding, Receipt, Work
from levers.audit.patterns import base_name, collapse_module, receipt
from levers.audit.rules.registry import registered, rule
from levers.capture.records import Capture, OpRecord
from levers.hardware import FLOAT8_MIN_CAPABILITY, FLOAT8_NARROW, FLOAT8_NARROW_MEASURED
from levers.units import format_flops, format_ms, format_share
from levers.vocab import CHANGES_NUMERICS, MEASURED

CODE, NAME = "DTYPE003", "bf16-matmul-on-float8-gpu"
LINEAR_MATMULS = ("mm", "addmm")
SCALED_MATMULS = ("_scaled_mm", "_scaled_grouped_mm")
LOW_PRECISION = ("bfloat16", "float16")
# the float8 lever's filter: K and N multiples of 16 (the float8 GEMM's requirement), and
# torchao's tensorwise thresholds (torchao.float8._auto_filter_for_recipe), below which the
# casts cost more than the faster matmul saves: a linear with K <= 4096 and N <= 1024 is left
MULTIPLE = 16
SMALL_K, SMALL_N = 4096, 1024
# the names of an output head (Hugging Face's lm_head, torchtitan's output, timm's head)
HEAD_NAMES = ("lm_head", "output", "head")
# The estimated saving, as a share of these matmuls' time. float8's peak is twice bf16's, so at
# most half; its scaling casts take part of it back. The least measured on levers' catalogue:
# llama 1b at batch 4 on an H200, float8 over compile-blocks saved 4.0 ms of a 98.6 ms step
# (1.04x), where these linears take 59 ms by the roofline (40.4 TFLOP at 70% of 989 TFLOP/s):
# 7% of their time. At batch 58 the float8 stack ran 19% less time per sample than the bf16
# stack at 45, about a quarter of these linears' time: the estimate takes the low end.
SAVED_FRACTION = 0.07
# At 30% of the step's GPU time the estimate is 2% of the step, the smallest gain a 10-step A/B
# tells from noise (the catalogue's batch-4 CI95 spans 1.01-1.10). The llama 1b at batch 4 that
# paid 1.04x has these linears at 39% of its eager step (59 of 150 ms by the roofline).
MIN_TIME_SHARE = 0.30
# FLOPs overstate the time share of matmuls (they run near the peak, while elementwise work takes
# time with few FLOPs): the same llama has these linears at 79% of its FLOPs and 39% of its eager
# time, so half of the FLOPs stands for about a quarter to a third of the time.
MIN_FLOP_SHARE = 0.50
NUM_RECEIPTS = 3


@dataclass(frozen=True)
class LinearMatmuls:
    """One ``nn.Linear`` of the step and its matmuls (forward, backward, recomputed)."""

    path: str
    k: int  # in_features
    n: int  # out_features
    m: int  # rows (tokens) of its first forward call
    dtype: str  # the compute dtype on the GPU
    first: OpRecord  # its first forward matmul: the source line is the receipt
    ops: tuple[OpRecord, ...]
    why: str  # why float8 leaves it (or it is not a bf16/fp16 matmul); "" when it converts


def float8_in_use(capture: Capture) -> tuple[list[OpRecord], list[str]]:
    """The step's ops on float8 tensors (torchao's casts to float8, ``_scaled_mm``) and its
    Float8 modules. torchao's matmuls on its float8 tensor subclass are recorded as ``mm`` with
    the subclass's high-precision dtype; its casts to float8 are what the capture sees."""
    ops = [
        op
        for op in capture.ops
        if base_name(op.name) in SCALED_MATMULS
        or any(t.dtype.startswith("float8") for t in (*op.inputs, *op.outputs))
    ]
    modules = [path for path, cls in capture.modules.items() if cls.startswith("Float8")]
    return ops, modules


def step_gpu(capture: Capture, config: RuleConfig) -> tuple[str, tuple[int, int]]:
    """The name and compute capability of the GPU the step runs on: the one that ran a GPU
    capture (its recorded capability, which also covers a GPU levers' table lacks), the target
    of a CPU capture."""
    if config.on_gpu:
        name = str(capture.env.get("device_name") or config.gpu.title)
        gpu = capture.env.get("gpu")
        text = str(gpu.get("capability") or "") if isinstance(gpu, dict) else ""
        major, _, minor = text.partition(".")
        if major.isdigit() and minor.isdigit():
            return name, (int(major), int(minor))
        return name, config.gpu.sm
    return config.gpu.title, config.gpu.sm


def vocabulary(capture: Capture) -> int | None:
    """The rows of the step's largest embedding table (the float8 lever's vocabulary)."""
    rows = [
        op.inputs[0].shape[0]
        for op in capture.ops
        if base_name(op.name) == "embedding" and op.inputs and op.inputs[0].shape
    ]
    return max(rows, default=None)


def _is_2d(op: OpRecord) -> bool:
    return len(op.inputs) >= 2 and all(len(t.shape) == 2 for t in op.inputs[-2:])


def linear_matmuls(capture: Capture, config: RuleConfig) -> list[LinearMatmuls]:
    """Every ``nn.Linear`` whose matmuls the capture holds, and whether float8 converts it."""
    by_module: dict[str, list[OpRecord]] = {}
    for op in capture.ops:
        if (
            base_name(op.name) in LINEAR_MATMULS
            and op.module
            and capture.modules.get(op.module) == "Linear"
        ):
            by_module.setdefault(op.module, []).append(op)
    vocab = vocabulary(capture)
    out = []
    for path, ops in by_module.items():
        first = next((op for op in ops if op.phase == "forward" and _is_2d(op)), None)
        if first is None:
            continue  # no forward matmul recorded: its K and N are not known
        # mm(x[M, K], w.t()[K, N]); addmm(bias[N], x[M, K], w.t()[K, N])
        (m, _), (k, n) = first.inputs[-2].shape, first.inputs[-1].shape
        dtype = config.compute_dtype(first.inputs[-2].dtype)
        if path.rsplit(".", 1)[-1] in HEAD_NAMES or n == vocab:
            why = f"the output head (N={n}): its rounding lands on the logits"
        elif k % MULTIPLE or n % MULTIPLE:
            why = f"K={k} or N={n} is not a multiple of {MULTIPLE}"
        elif k <= SMALL_K and n <= SMALL_N:
            why = f"too small to pay (K={k}, N={n}; left when K <= {SMALL_K} and N <= {SMALL_N})"
        elif dtype not in LOW_PRECISION:
            why = f"runs in {dtype}, not bf16/fp16"
        else:
            why = ""
        out.append(LinearMatmuls(path, k, n, m, dtype, first, tuple(ops), why))
    return out


def already_right(capture: Capture, config: RuleConfig) -> AlreadyRight | None:
    """float8 training in the step: Float8 modules, ops on float8 tensors."""
    ops, modules = float8_in_use(capture)
    if not ops and not modules:
        return None
    seen = []
    if modules:
        classes = ", ".join(sorted({capture.modules[path] for path in modules}))
        seen.append(f"{len(modules)} {classes} modules")
    if ops:
        seen.append(f"{len(ops)} ops on float8 tensors per step (casts, scaled matmuls)")
    first = modules[0] if modules else next((op.module for op in ops if op.module), None)
    where = f" (first in {collapse_module(first)})" if first is not None else ""
    return AlreadyRight(CODE, "float8 matmuls", "; ".join(seen) + where)


@rule(
    CODE, NAME, severity="medium", fix_safety=CHANGES_NUMERICS, levers=("float8",),
    already_right=(already_right,),
)
def check(capture: Capture, config: RuleConfig) -> Iterator[Finding]:
    float8_ops, float8_modules = float8_in_use(capture)
    # float8 runs already: the already-right item says so
    if float8_ops or float8_modules:
        return
    gpu_name, capability = step_gpu(capture, config)
    # no float8 tensor cores on this GPU
    if capability < FLOAT8_MIN_CAPABILITY:
        return
    every_linear = linear_matmuls(capture, config)
    linears = [lin for lin in every_linear if not lin.why]
    # no linear passes float8's filter
    if not linears:
        return
    left_out = [lin for lin in every_linear if lin.why]
    ops = [op for lin in linears for op in lin.ops]
    b = step_bottleneck(capture, config) if config.on_gpu else None
    if b is not None and b.provenance == MEASURED:
        eligible_ms = sum(op.device_us or 0.0 for op in ops) / 1e3
        share = eligible_ms / b.step_ms if b.step_ms > 0 else 0.0
        # these linears are a small part of the step's GPU time
        if share < MIN_TIME_SHARE:
            return
        yield _finding(linears, left_out, capture, config, gpu_name, capability, share, b.step_ms)
        return
    total_flops = sum(op.flops for op in capture.ops)
    share = sum(op.flops for op in ops) / total_flops if total_flops else 0.0
    # a CPU capture (or a GPU one without device time): these linears are few of the FLOPs
    if share < MIN_FLOP_SHARE:
        return
    yield _finding(linears, left_out, capture, config, gpu_name, capability, share, None)


def _finding(
    linears: list[LinearMatmuls],
    left_out_linears: list[LinearMatmuls],  # those float8's filter leaves, with why
    capture: Capture,
    config: RuleConfig,
    gpu_name: str,
    capability: tuple[int, int],
    share: float,
    step_ms: float | None,
) -> Finding:
    ops = [op for lin in linears for op in lin.ops]
    by_time = step_ms is not None
    if by_time:
        eligible_ms = sum(op.device_us or 0.0 for op in ops) / 1e3
        amount = (
            f"{format_share(share)} of the step's GPU time ({format_ms(eligible_ms)} of "
            f"{format_ms(step_ms)}, measured)"
        )
        basis = "of these matmuls' measured time"
    else:
        eligible_ms = roofline.ops_us(
            ops, config.gpu, assumed_dtype=config.assumed_dtype,
            tf32=bool(capture.settings.get("cuda_matmul_allow_tf32")),
        ) / 1e3
        total_flops = sum(op.flops for op in capture.ops)
        amount = (
            f"{format_share(share)} of the step's FLOPs ({format_flops(sum(op.flops for op in ops))}"
            f" of {format_flops(total_flops)}; the share is of FLOPs, not time)"
        )
        basis = f"of these matmuls' roofline time on {config.gpu.title}"
    saved_ms = eligible_ms * SAVED_FRACTION
    dtypes = "/".join(sorted({lin.dtype for lin in linears}))
    cap = f"{capability[0]}.{capability[1]}"
    where = "" if config.on_gpu else " (the --gpu target)"
    compiled = bool((capture.settings.get("compile") or {}).get("frames_compiled"))
    message = (
        f"{len(linears)} nn.Linear layers that pass float8's filter run {len(ops)} {dtypes} "
        f"matmuls per step, {amount}, on {gpu_name}{where}, compute capability {cap}: its float8 "
        f"tensor cores run at twice the dense bf16 rate. float8 would save an estimated "
        f"{format_ms(saved_ms)} per step ({SAVED_FRACTION:.0%} {basis}; estimated, not measured "
        "on this step). Measured on levers' catalogue (llama 1b, H200): float8 with compile-blocks "
        "1.04x over compile-blocks alone at batch 4; with raise-batch the float8 stack 2.15x the "
        "default (batch 58) against the bf16 stack's 1.74x (batch 45)"
    )
    widest = max(min(lin.k, lin.n) for lin in linears)
    if widest <= FLOAT8_NARROW:
        # the lever's own measured regime (levers.levers.float8.slower_here): tune leaves it out
        message += (
            f". But the widest of these matmuls has a smaller side of {widest}: where every one "
            f"is at most {FLOAT8_NARROW} wide, float8 on top of compile ran "
            f"{FLOAT8_NARROW_MEASURED} on an "
            "H200 (measured), so levers tune does not try it here; prove it with levers ab first"
        )
    if compiled:
        fix_title = (
            "Train these linears in float8 (levers.apply(model, \"float8\"), torchao's "
            "Float8Linear) before the step's torch.compile: float8 pays only compiled, as this "
            "step is"
        )
    else:
        fix_title = (
            "Train these linears in float8 together with compile-blocks or compile-model "
            "(--lever float8,compile-blocks): float8 pays only compiled; eager, its scaling "
            "casts are separate kernels"
        )
    top = _top_groups(linears, by_time)
    step_total = step_ms if by_time else sum(op.flops for op in capture.ops)
    receipts = tuple(_receipt(group, by_time, step_total) for group in top[:NUM_RECEIPTS])
    left_out = {(collapse_module(lin.path), lin.why) for lin in left_out_linears}
    details: dict[str, Any] = {
        "narrow": widest <= FLOAT8_NARROW,
        "share": share,
        "share_of": "gpu_time" if by_time else "flops",
        "eligible_ms": eligible_ms,
        "estimated_saved_ms": saved_ms,
        "saved_fraction": SAVED_FRACTION,
        "saving": "estimated",
        "num_linears": len(linears),
        "num_matmuls": len(ops),
        "capability": cap,
        "gpu": gpu_name,
        "compiled": compiled,
        "linears": [
            {"module": lin.path, "k": lin.k, "n": lin.n, "m": lin.m, "dtype": lin.dtype}
            for lin in linears
        ],
        "left_out": [{"module": m, "why": why} for m, why in sorted(left_out)],
    }
    return registered(CODE).finding(
        message=message,
        fix_title=fix_title,
        receipts=receipts,
        effort="S",
        risk="medium",
        work=Work(
            now_ops=tuple(op.index for op in ops),
            calls_per_step=len(ops),
            fixed_fraction_of_now=1.0 - SAVED_FRACTION,
            fixed_fraction_why=(
                f"float8 saves an estimated {SAVED_FRACTION:.0%} of these matmuls' time, the "
                "least it saved on levers' catalogue: 1.04x over compile-blocks, llama 1b batch 4, "
                "H200"
            ),
        ),
        details=details,
    )


def _top_groups(linears: list[LinearMatmuls], by_time: bool) -> list[list[LinearMatmuls]]:
    """The linears grouped by collapsed path, K and N, the most time (or FLOPs) first."""
    groups: dict[tuple[str | None, int, int], list[LinearMatmuls]] = {}
    for lin in linears:
        groups.setdefault((collapse_module(lin.path), lin.k, lin.n), []).append(lin)
    return sorted(groups.values(), key=lambda g: -_weight(g, by_time))


def _weight(group: list[LinearMatmuls], by_time: bool) -> float:
    ops = [op for lin in group for op in lin.ops]
    if by_time:
        return sum(op.device_us or 0.0 for op in ops)
    return float(sum(op.flops for op in ops))


def _receipt(group: list[LinearMatmuls], by_time: bool, step_total: float) -> Receipt:
    lin = group[0]
    weight = _weight(group, by_time)
    if by_time:
        cost = f"{format_ms(weight / 1e3)}, {format_share(weight / 1e3 / step_total)} of the step"
    else:
        cost = f"{format_flops(weight)}, {format_share(weight / step_total)} of the FLOPs"
    return receipt(
        lin.first.source,
        module=collapse_module(lin.path),
        op=lin.first.name,
        shapes=f"K={lin.k} N={lin.n} M={lin.m} {lin.dtype} ({cost})",
        count=sum(len(g.ops) for g in group),
    )
