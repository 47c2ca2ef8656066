"""Activation-checkpointing policies side by side: tokens/s against peak memory on one GPU.

On the ``hf`` llama at ``size=1b`` (16 layers, width 2048, seq 2048, bf16 autocast, fused AdamW)
it times, per row, 3 warm-up and ``--steps`` (12) timed steps and reads the peak allocated
memory over the timed steps:

- ``none``, ``ac-full``, ``torchtitan-op-sac`` (torchtitan's selective policy written here as
  torchtitan does: save SDPA and every other ``aten.mm``, no FLOP threshold: the peer) and
  ``ac-selective`` (levers' policy at the threshold derived below) at batch 4 and batch 8;
- ``ac-budget`` at batch 4 at torchtitan's measured peak, at ac-full's measured peak, at 22 GiB
  and a sweep of budgets; at batch 8 at torchtitan's and ac-full's peaks. Its inputs are levers
  memory's prediction (run in CPU worker processes with CUDA hidden, meanwhile the GPU times
  the other rows) and the op times of a GPU capture of the ``none`` step; each plan is checked
  by a full prediction (``choose_verified``) before it is timed;
- the knee of matmul recompute time per byte saved: bf16 matmuls [M, k] @ [k, n] for the 1b
  block's shapes and smaller widths, timed against a memory-bound op writing the same bytes;
- compiled rows at the first batch (issue 21), every block compiled by ``compile-blocks``
  (inductor): ``compiled-none`` (no checkpointing), ``compiled-torch-budget`` (torch's
  ``torch._functorch.config.activation_memory_budget`` at 0.3, 0.5 and 0.7 for every block)
  and, for each of those, ``compiled-ac-budget``: ``compile-blocks,ac-budget`` at that row's
  measured peak as the budget (ac-budget's compiled plan, chosen on the CPU workers by levers
  memory's prediction of the compiled step; the row keeps the plan's levels, its predicted
  peak and the prediction of torch's uniform ratio beside the torch row's measurement). Each
  compiled row starts from a fresh dynamo (torch's config is not in dynamo's guards);
- with ``--fused-loss-ratios R,...``, the same with a fused loss: levers'
  ``compile-blocks,fused-linear-cross-entropy,ac-budget`` at each torch row's measured peak
  (``compiled-ac-budget+flce``: the plan made for the step with levers' fused loss, Liger's
  kernel where installed), and the peer, torch's ratio with Liger's fused linear cross-entropy
  patched as its users patch it (``compiled-torch-budget+liger-flce``), at each ratio R.
- with ``--float8-ratios R,...``, float8 on both sides: levers'
  ``compile-blocks,float8,fused-linear-cross-entropy,ac-budget`` at each torch row's measured
  peak (``compiled-ac-budget+flce+float8``), and the peer, torchtitan's float8 recipe with torch's
  ratio R and Liger's fused loss (``compiled-torch-budget+float8+liger-flce``), with levers' float8
  stack planned again at that peer row's peak (``budget_is_peak_of`` names the row matched).

It writes ``OUT/summary.json`` (one object per row: policy, batch_size, budget_bytes or null,
tokens_per_s, tokens_per_s_ci95, peak_allocated_bytes, ms_per_step_median, ms_per_step_iqr,
predicted_peak_bytes, plan; with commit, torch, gpu), ``OUT/knee.json`` and ``OUT/frontier.svg``
(peak against tokens/s; matplotlib is not needed).

Usage, from the repository root:

    python bench/ac_policies.py --out bench/results/ac_policies_h200      # the H200 run
    python bench/ac_policies.py --smoke --out /tmp/ac_smoke               # CPU, tiny shapes
    python bench/ac_policies.py --batches 4 --out ...                     # the batch-4 rows only
    python bench/ac_policies.py --only-compiled --batches 4 --out bench/results/ac_policies_h200
    python bench/ac_policies.py --only-compiled --batches 4 --ratios 0.5 --fused-loss-ratios 0.5,0.8 \
        --out bench/results/ac_policies_h200                              # with the fused loss
    python bench/ac_policies.py --only-compiled --batches 4 --ratios 0.5 --fused-loss-ratios 0.5 \
        --float8-ratios 0.5 --out bench/results/ac_policies_float8_h200   # float8 on both sides

``--skip-compiled`` leaves the compiled rows out (the eager run as before, ``gpu_round.sh ac``);
``--only-compiled`` runs the compiled rows alone and keeps the other rows of ``OUT/summary.json``
(and its ``meta.json``); its own meta goes to ``OUT/meta_compiled.json``. On a CPU (``--smoke``)
the compiled rows use the ``aot_eager_decomp_partition`` backend (the min-cut partitioner, no
code generation) and the budgets are the predicted peaks of torch's uniform ratios.

``levers list`` reads ``OUT/summary.json`` (with ``meta.json``) as the checkpointing levers'
catalogue rows when OUT is ``bench/results/ac_policies_<gpu>``.
"""

from __future__ import annotations

import argparse
import concurrent.futures as futures
import datetime
import gc
import importlib.util
import json
import multiprocessing
import os
import random
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import torch  # noqa: E402
from torch.utils.checkpoint import CheckpointPolicy  # noqa: E402

import levers  # noqa: E402

GIB = 2**30
WARMUP_STEPS = 3


# --- the peer: torchtitan's op-level SAC, as torchtitan writes it ---------------------------


def torchtitan_policy() -> Any:
    aten = torch.ops.aten
    save = {aten.mm.default}
    for name in (
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
    ):
        if hasattr(aten, name):
            save.add(getattr(aten, name).default)
    meta: dict[str, int] = defaultdict(int)

    def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        mode = "recompute" if ctx.is_recompute else "forward"
        key = f"{mode}_mm_count"
        if func is aten.mm.default:
            meta[key] += 1
        # saves the output of every other mm (the 1st, 3rd, ...) and of attention
        to_save = func in save and not (func is aten.mm.default and meta[key] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if to_save else CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def apply_torchtitan(model: torch.nn.Module) -> Any:
    from levers.levers.checkpointing import blocks_or_reason, wrap_blocks
    from levers.levers.sac import contexts

    blocks, reason = blocks_or_reason(model)
    assert reason is None, reason
    return wrap_blocks(model, blocks, lambda i, b: lambda: contexts(torchtitan_policy))


# --- CPU workers: predictions with CUDA hidden ----------------------------------------------


def _hide_cuda() -> None:
    os.environ["CUDA_VISIBLE_DEVICES"] = ""


def predict_inputs_job(params: dict[str, Any], gpu: str) -> Any:
    from levers.levers.ac_budget_inputs import predict_inputs

    return predict_inputs("hf", params, gpu)


def verified_plan_job(
    params: dict[str, Any], gpu: str, inputs: Any, budget: int, overhead_us: float
) -> Any:
    from levers.levers.ac_budget import choose_verified, plan_peak_predictor

    predict_peak = plan_peak_predictor("hf", params, inputs, gpu)
    try:
        plan, peak = choose_verified(inputs, budget, predict_peak, sac_op_overhead_us=overhead_us)
    except ValueError as exc:  # a budget under the smallest reachable peak
        return None, None, str(exc)
    return plan, peak, None


def compiled_plan_job(
    params: dict[str, Any], gpu: str, budget: int | None, ratio: str, num_blocks: int,
    stack: tuple[tuple[str, dict[str, Any]], ...] = (),
) -> dict[str, Any]:
    """ac-budget's compiled plan for ``budget`` (when None: the predicted peak of torch's
    uniform ``ratio``), and the prediction of that uniform ratio; ``stack``: the levers applied
    before ac-budget (the fused loss), in the predicted step as in the run."""
    from levers.levers.ac_budget_compiled import choose_compiled, levels_peak_predictor

    predict = levels_peak_predictor("hf", params, gpu, stack=stack)
    peaks: dict[tuple[str, ...], int] = {}

    def memo(levels: tuple[str, ...]) -> int:
        if levels not in peaks:
            peaks[levels] = predict(levels)
        return peaks[levels]

    uniform = memo((ratio,) * num_blocks)
    limit = uniform if budget is None else budget
    started = time.perf_counter()
    try:
        plan = choose_compiled(num_blocks, lambda lowest, highest: limit, memo)
    except ValueError as exc:
        return {"budget": limit, "error": str(exc), "uniform_predicted_peak_bytes": uniform}
    return {
        "budget": limit,
        "uniform_predicted_peak_bytes": uniform,
        "plan": plan,
        "plan_s": time.perf_counter() - started,
    }


# --- timing one row -------------------------------------------------------------------------


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # sync point: timing boundary


def bootstrap_ci95(values: list[float], seed: int = 0, rounds: int = 2000) -> tuple[float, float]:
    rng = random.Random(seed)
    medians = sorted(
        statistics.median(rng.choices(values, k=len(values))) for _ in range(rounds)
    )
    return medians[int(0.025 * rounds)], medians[int(0.975 * rounds) - 1]


def time_row(workload: Any, steps: int) -> dict[str, Any]:
    device = workload.device
    for _ in range(WARMUP_STEPS):
        workload.step()
    _sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    step_s = []
    for _ in range(steps):
        t0 = time.perf_counter()
        workload.step()
        _sync(device)
        step_s.append(time.perf_counter() - t0)
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    tokens = workload.tokens_per_step
    rates = [tokens / s for s in step_s]
    low, high = bootstrap_ci95(rates)
    ms = sorted(s * 1e3 for s in step_s)
    return {
        "tokens_per_s": statistics.median(rates),
        "tokens_per_s_ci95": [low, high],
        "peak_allocated_bytes": peak,
        "ms_per_step_median": statistics.median(ms),
        "ms_per_step_iqr": [ms[len(ms) // 4], ms[(3 * len(ms)) // 4]],
        "ms_per_step_min_max": [ms[0], ms[-1]],
        "num_steps": steps,
    }


def build(params: dict[str, Any]) -> Any:
    from levers.loader import load_workload

    return load_workload("hf", params)


def release(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def run_row(policy: str, params: dict[str, Any], steps: int, apply: Any = None) -> dict[str, Any]:
    try:
        return _run_row(policy, params, steps, apply)
    except torch.cuda.OutOfMemoryError as exc:
        release(torch.device(params["device"]))
        print(f"{policy} b{params['batch_size']}: out of memory", flush=True)
        return {
            "policy": policy,
            "batch_size": params["batch_size"],
            "budget_bytes": None,
            "peak_allocated_bytes": None,
            "error": f"out of memory: {str(exc)[:200]}",
        }


def _run_row(policy: str, params: dict[str, Any], steps: int, apply: Any) -> dict[str, Any]:
    workload = build(params)
    extra: dict[str, Any] = {}
    if apply is not None:
        extra = apply(workload) or {}
    row = {"policy": policy, "batch_size": params["batch_size"], "budget_bytes": None}
    row.update(time_row(workload, steps))
    row.update(extra)
    device = workload.device
    del workload
    release(device)
    print(
        f"{policy:22s} b{row['batch_size']:<2d} {row['ms_per_step_median']:8.1f} ms "
        f"{row['tokens_per_s'] / 1e3:7.1f}k tok/s peak "
        f"{(row['peak_allocated_bytes'] or 0) / GIB:6.2f} GiB",
        flush=True,
    )
    return row


def capture_times(params: dict[str, Any]) -> Any:
    """A capture of the no-checkpointing step, for the op times ac-budget chooses by."""
    from levers.capture.step import capture_step

    workload = build(params)
    capture = capture_step(workload, warmup=1, timed=0)
    device = workload.device
    del workload
    release(device)
    return capture


# --- compiled rows -------------------------------------------------------------------------

COMPILED_RATIOS = ("0.3", "0.5", "0.7")


def compile_blocks_of(backend: str) -> Any:
    """The apply of a compiled row: a fresh dynamo, then compile-blocks with ``backend``."""

    def apply(workload: Any) -> dict[str, Any]:
        from levers.levers import compile_blocks
        from levers.levers.lever import apply as apply_lever

        torch._dynamo.reset()
        apply_lever(workload, compile_blocks.LEVER, {"backend": backend})
        return {"compiled": True, "backend": backend}

    return apply


FUSED_LOSS = (("fused-linear-cross-entropy", {}),)  # levers' fused loss (Liger's kernel on CUDA)
FLOAT8 = (("float8", {}),)  # levers' float8 (torchao's tensorwise recipe on the linears that pay)
FLOAT8_POLICY = "compiled-ac-budget+flce+float8"


def liger_loss_then(apply: Any, undos: list[Any]) -> Any:
    """``apply``, then the peer's fused loss: Liger Kernel's fused linear cross-entropy patched on
    the model as its users apply it (levers_vs_peers.py's transform); the patch's undo is
    appended to ``undos`` (the modeling module's globals, put back after the row)."""
    from levers_vs_peers import LIGER_FLCE_ONLY, _liger

    def both(workload: Any) -> dict[str, Any]:
        # the blocks compiled first: compile-blocks refuses a model that runs Liger's kernels,
        # and Liger's loss patches the model's forward, outside the blocks
        fields = apply(workload)
        undos.append(_liger(workload, **LIGER_FLCE_ONLY))
        return {**fields, "peer_loss": "liger fused linear cross-entropy"}

    return both


def compiled_rows(
    params: dict[str, Any],
    pred_params: dict[str, Any],
    steps: int,
    pool: Any,
    gpu: str,
    backend: str,
    smoke: bool,
    rows: list[dict[str, Any]],
    write: Any,
    ratios: tuple[str, ...] = COMPILED_RATIOS,
    fused_loss_ratios: tuple[str, ...] = (),
    float8_ratios: tuple[str, ...] = (),
) -> None:
    """The compiled rows at one batch: none, torch's ``ratios``, and ac-budget at each ratio's
    measured peak (its plan made on the CPU workers while the GPU runs the next row). With
    ``fused_loss_ratios``, also the stack with a fused loss: levers'
    ``compile-blocks,fused-linear-cross-entropy,ac-budget`` at each torch row's measured peak
    (``compiled-ac-budget+flce``, planned for the step with the fused loss), and the peer, torch's
    ratio with Liger's fused loss (``compiled-torch-budget+liger-flce``), at each of
    ``fused_loss_ratios``. With ``float8_ratios``, also float8 on both sides: levers'
    ``compile-blocks,float8,fused-linear-cross-entropy,ac-budget``
    (``compiled-ac-budget+flce+float8``) at each torch row's measured peak, and the peer,
    torchtitan's float8 recipe with torch's ratio and Liger's fused loss
    (``compiled-torch-budget+float8+liger-flce``) at each of ``float8_ratios``, with levers' float8
    stack planned again at that peer row's measured peak."""
    from torch._functorch import config as functorch_config

    from levers.levers.ac_budget_compiled import apply_levels

    compile_blocks = compile_blocks_of(backend)
    num_blocks = build_layers(params)
    rows.append(run_row("compiled-none", params, steps, compile_blocks))
    write()
    plans = []  # (policy, ratio, the row whose measured peak is the budget, the plan's job)
    stacks = {"compiled-ac-budget": ()}
    if fused_loss_ratios:
        stacks["compiled-ac-budget+flce"] = FUSED_LOSS
    if float8_ratios:
        stacks[FLOAT8_POLICY] = FLOAT8 + FUSED_LOSS
    for ratio in ratios:

        def torch_budget(workload: Any, ratio: str = ratio) -> dict[str, Any]:
            return {**compile_blocks(workload), "activation_memory_budget": float(ratio)}

        # read when each block's graph is partitioned, in the row's first step
        with functorch_config.patch(activation_memory_budget=float(ratio)):
            row = run_row("compiled-torch-budget", params, steps, torch_budget)
        rows.append(row)
        write()
        budget = None if smoke else row.get("peak_allocated_bytes")
        if budget is None and not smoke:
            continue  # the torch row ran out of memory: no peak to match
        for policy, stack in stacks.items():
            job = pool.submit(compiled_plan_job, pred_params, gpu, budget, ratio, num_blocks, stack)
            plans.append((policy, ratio, "compiled-torch-budget", job))
    have_liger = importlib.util.find_spec("liger_kernel") is not None
    if (fused_loss_ratios or float8_ratios) and not have_liger:
        print("liger-kernel is not installed: the peer rows with Liger's loss are left out")
    # the peers, while the plans are made: torch's ratio with Liger's fused loss, then with
    # torchtitan's float8 recipe as well
    peers = [("compiled-torch-budget+liger-flce", ratio, False) for ratio in fused_loss_ratios]
    peers += [("compiled-torch-budget+float8+liger-flce", ratio, True) for ratio in float8_ratios]
    for policy, ratio, float8 in peers if have_liger else ():
        undos: list[Any] = []

        def torch_budget(workload: Any, ratio: str = ratio, float8: bool = float8) -> dict[str, Any]:
            fields = {}
            if float8:
                from levers_vs_peers import _torchtitan_float8

                _torchtitan_float8(workload)  # before the blocks first trace, as torchtitan does
                fields["peer_float8"] = "torchtitan tensorwise, auto_filter_small_kn, head left out"
            return {**compile_blocks(workload), "activation_memory_budget": float(ratio), **fields}

        with functorch_config.patch(activation_memory_budget=float(ratio)):
            row = run_row(policy, params, steps, liger_loss_then(torch_budget, undos))
        for undo in undos:
            undo()
        rows.append(row)
        write()
        if float8 and row.get("peak_allocated_bytes") is not None:  # levers' float8 stack there
            job = pool.submit(
                compiled_plan_job, pred_params, gpu, row["peak_allocated_bytes"], ratio, num_blocks,
                stacks[FLOAT8_POLICY],
            )
            plans.append((FLOAT8_POLICY, ratio, row["policy"], job))
    for policy, ratio, matched, job in plans:
        found = job.result()
        stack = stacks[policy]
        fields = {
            "budget_bytes": found["budget"],
            "budget_is_peak_of": matched,
            "matches_activation_memory_budget": float(ratio),
            "torch_uniform_predicted_peak_bytes": found["uniform_predicted_peak_bytes"],
            "stack": [lever_id for lever_id, _ in stack],
        }
        if "error" in found:
            rows.append(
                {"policy": policy, "batch_size": params["batch_size"], **fields,
                 "error": found["error"]}
            )
            print(f"{policy} @ {ratio}: {found['error']}", flush=True)
            continue
        plan = found["plan"]
        fields.update(
            {
                "predicted_peak_bytes": plan.predicted_peak_bytes,
                "plan": {
                    "levels": list(plan.levels),
                    "counts": plan.counts(),
                    "last_block_free": plan.last_block_free,
                    "position": plan.position,
                    "num_positions": plan.num_positions,
                    "num_predictions": plan.num_predictions,
                    "plan_s": found["plan_s"],
                },
            }
        )

        def budgeted(
            workload: Any, levels: Any = plan.levels, fields: Any = fields, stack: Any = stack
        ) -> Any:
            compile_blocks(workload)
            if stack:  # the levers' own fused loss, as ac-budget's prediction applied it
                levers.apply(workload, [lever_id for lever_id, _ in stack])
            apply_levels(workload.model, levels)
            return fields

        row = run_row(policy, params, steps, budgeted)
        row["budget_bytes"] = found["budget"]
        rows.append(row)
        write()


def build_layers(params: dict[str, Any]) -> int:
    from levers.workloads.llama import SIZES

    return SIZES[params["size"]].layers


# --- the knee of recompute time per byte saved ----------------------------------------------


def _time_us(fn: Any, device: torch.device, reps: int) -> float:
    for _ in range(3):
        fn()
    if device.type != "cuda":
        samples = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e6)
        return statistics.median(samples)
    samples = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()  # sync point: reading the event
        samples.append(start.elapsed_time(end) * 1e3)
    return statistics.median(samples)


def measure_knee(device: torch.device, tokens: int, widths: list[int], reps: int) -> dict:
    """Per matmul shape: time, bytes of the output, time per byte, and that against a
    memory-bound op (``silu``) writing the same bytes; the knee is the smallest FLOP count from
    which every larger matmul recomputes at least ``KNEE_RATIO`` times as dearly per byte."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    shapes = set()
    for w in widths:
        for n in (w, int(2.75 * w)):
            shapes.add((tokens, w, n))  # projections of a width-w block: [M, w] @ [w, n]
            shapes.add((tokens, n, w))  # the down projection
    rows = []
    for m, k, n in sorted(shapes, key=lambda s: 2 * s[0] * s[1] * s[2]):
        a = torch.randn(m, k, device=device, dtype=dtype)
        b = torch.randn(k, n, device=device, dtype=dtype)
        out = torch.empty(m, n, device=device, dtype=dtype)
        mm_us = _time_us(lambda: torch.mm(a, b, out=out), device, reps)
        ew_us = _time_us(lambda: torch.nn.functional.silu(out), device, reps)
        nbytes = out.numel() * out.element_size()
        rows.append(
            {
                "m": m,
                "k": k,
                "n": n,
                "flops": 2 * m * k * n,
                "bytes": nbytes,
                "mm_us": mm_us,
                "elementwise_us": ew_us,
                "mm_us_per_mib": mm_us / (nbytes / 2**20),
                "ratio_to_elementwise": mm_us / ew_us,
            }
        )
        del a, b, out
    knee = None
    for index, row in enumerate(rows):
        if all(r["ratio_to_elementwise"] >= KNEE_RATIO for r in rows[index:]):
            knee = row["flops"]
            break
    return {"tokens": tokens, "dtype": str(dtype), "knee_ratio": KNEE_RATIO, "knee_flops": knee, "shapes": rows}


KNEE_RATIO = 2.0


# --- the frontier plot ----------------------------------------------------------------------


def frontier_svg(rows: list[dict[str, Any]], path: Path) -> None:
    points = [r for r in rows if r.get("peak_allocated_bytes") or r.get("predicted_peak_bytes")]
    if not points:
        return
    width, height, pad = 760, 480, 60

    def peak(r: dict[str, Any]) -> float:
        return (r.get("peak_allocated_bytes") or r.get("predicted_peak_bytes")) / GIB

    xs = [peak(r) for r in points]
    ys = [r["tokens_per_s"] for r in points]
    x0, x1 = min(xs) * 0.95, max(xs) * 1.05
    y0, y1 = min(ys) * 0.95, max(ys) * 1.05

    def sx(x: float) -> float:
        return pad + (x - x0) / (x1 - x0 or 1) * (width - 2 * pad)

    def sy(y: float) -> float:
        return height - pad - (y - y0) / (y1 - y0 or 1) * (height - 2 * pad)

    colours = {
        "none": "#444",
        "ac-full": "#d62728",
        "torchtitan-op-sac": "#ff7f0e",
        "ac-selective": "#9467bd",
        "ac-budget": "#1f77b4",
    }
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        'font-family="sans-serif" font-size="11">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<line x1="{pad}" y1="{height - pad}" x2="{width - pad}" y2="{height - pad}" stroke="black"/>',
        f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{height - pad}" stroke="black"/>',
        f'<text x="{width / 2}" y="{height - 15}" text-anchor="middle">peak allocated (GiB)</text>',
        f'<text x="15" y="{height / 2}" transform="rotate(-90 15 {height / 2})" '
        'text-anchor="middle">tokens/s</text>',
    ]
    for i in range(6):
        xv, yv = x0 + (x1 - x0) * i / 5, y0 + (y1 - y0) * i / 5
        parts.append(f'<text x="{sx(xv)}" y="{height - pad + 15}" text-anchor="middle">{xv:.1f}</text>')
        parts.append(f'<text x="{pad - 5}" y="{sy(yv) + 4}" text-anchor="end">{yv / 1e3:.1f}k</text>')
    for batch in sorted({r["batch_size"] for r in points}):
        budget = sorted(
            (r for r in points if r["policy"] == "ac-budget" and r["batch_size"] == batch), key=peak
        )
        if len(budget) > 1:
            path_d = " ".join(f"{sx(peak(r)):.1f},{sy(r['tokens_per_s']):.1f}" for r in budget)
            parts.append(f'<polyline points="{path_d}" fill="none" stroke="#1f77b4" stroke-dasharray="4"/>')
    for r in points:
        colour = colours.get(r["policy"], "#2ca02c")
        x, y = sx(peak(r)), sy(r["tokens_per_s"])
        marker = "circle" if r["batch_size"] == min(p["batch_size"] for p in points) else "rect"
        if marker == "circle":
            parts.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="{colour}"/>')
        else:
            parts.append(f'<rect x="{x - 4:.1f}" y="{y - 4:.1f}" width="8" height="8" fill="{colour}"/>')
        label = r["policy"] + f" b{r['batch_size']}"
        if r.get("budget_bytes"):
            label += f" @{r['budget_bytes'] / GIB:.1f}"
        parts.append(f'<text x="{x + 6:.1f}" y="{y - 6:.1f}" fill="{colour}">{label}</text>')
    parts.append(
        f'<text x="{pad}" y="20">circles: batch {min(r["batch_size"] for r in points)}, '
        "squares: larger batch; dashed: ac-budget sweep</text></svg>"
    )
    tmp = path.with_suffix(".svg.tmp")
    tmp.write_text("\n".join(parts))
    tmp.replace(path)


# --- the run ----------------------------------------------------------------------------------


def write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str))
    tmp.replace(path)


def plan_fields(plan: Any, inputs: Any, verified: Any) -> dict[str, Any]:
    return {
        "predicted_peak_bytes": verified,
        "plan": {
            "num_checkpointed": plan.num_checkpointed,
            "num_full": plan.num_full,
            "num_selective": plan.num_selective,
            "num_blocks": inputs.num_blocks,
            "saved_ops": sorted(f"{name}#{i}" for name, i in plan.save),
            "saved_bytes_per_block": plan.saved_bytes_per_block,
            "closed_form_peak_bytes": plan.predicted_peak_bytes,
            "recompute_us": plan.recompute_us,
            "time_source": inputs.time_source,
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--smoke", action="store_true", help="CPU, tiny shapes, few steps")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--jobs", type=int, default=None, help="CPU prediction workers")
    parser.add_argument(
        "--batches", default=None, help="comma-separated batch sizes (default 4,8; smoke 2,4)"
    )
    parser.add_argument(
        "--sac-op-overhead-us",
        type=float,
        default=None,
        help="ac-budget's per-op selective dispatch cost (default: the lever's)",
    )
    parser.add_argument(
        "--only-compiled",
        action="store_true",
        help="run the compiled rows only, keeping the other rows of OUT/summary.json",
    )
    parser.add_argument(
        "--skip-compiled", action="store_true", help="leave the compiled rows out"
    )
    parser.add_argument(
        "--fused-loss-ratios",
        default="",
        help="with the compiled rows: also levers' stack with its fused loss at each torch row's "
        "peak, and torch's ratio with Liger's fused loss at these ratios (e.g. 0.5,0.8)",
    )
    parser.add_argument(
        "--float8-ratios",
        default="",
        help="with the compiled rows: also levers' stack with float8 and the fused loss at each "
        "torch row's peak, and torchtitan's float8 recipe with torch's ratio and Liger's fused "
        "loss at these ratios (CUDA, compute capability 8.9+)",
    )
    parser.add_argument(
        "--ratios",
        default=",".join(COMPILED_RATIOS),
        help="torch's activation_memory_budget ratios of the compiled rows (default: %(default)s)",
    )
    args = parser.parse_args()
    ratios = tuple(r.strip() for r in args.ratios.split(",") if r.strip())
    fused_loss_ratios = tuple(r.strip() for r in args.fused_loss_ratios.split(",") if r.strip())
    float8_ratios = tuple(r.strip() for r in args.float8_ratios.split(",") if r.strip())
    for ratio in ratios + fused_loss_ratios + float8_ratios:
        if not 0.0 < float(ratio) < 1.0:
            parser.error(f"--ratios: {ratio} is not between 0 and 1")
    if float8_ratios and args.smoke:
        print("--float8-ratios: float8 needs a CUDA GPU of compute capability 8.9+; "
              "left out of --smoke")
        float8_ratios = ()
    args.out.mkdir(parents=True, exist_ok=True)

    from levers.environment import levers_commit_id
    from levers.levers import ac_budget, ac_full, ac_selective
    from levers.levers.ac_budget_inputs import with_capture_times
    from levers.levers.lever import Target

    smoke = args.smoke
    device = torch.device("cpu" if smoke else "cuda")
    if not smoke and not torch.cuda.is_available():
        raise SystemExit("no CUDA GPU here: run with --smoke for the CPU check")
    steps = args.steps or (3 if smoke else 12)
    size = "tiny" if smoke else "1b"
    batches = (2, 4) if smoke else (4, 8)
    if args.batches:
        batches = tuple(int(b) for b in args.batches.split(","))
    overhead_us = (
        ac_budget.SAC_OP_OVERHEAD_US if args.sac_op_overhead_us is None else args.sac_op_overhead_us
    )
    gpu_name = "cpu" if smoke else torch.cuda.get_device_name(device)
    spec_gpu = "h200"
    jobs = args.jobs or (2 if smoke else min(12, os.cpu_count() or 4))
    params = {b: {"size": size, "batch_size": b, "device": str(device)} for b in batches}
    pred_params = {b: {"size": size, "batch_size": b, "device": "cuda"} for b in batches}
    started = time.perf_counter()

    pool = futures.ProcessPoolExecutor(
        jobs, mp_context=multiprocessing.get_context("spawn"), initializer=_hide_cuda
    )
    rows: list[dict[str, Any]] = []
    kept: list[dict[str, Any]] = []  # rows of an earlier run that --only-compiled keeps

    def eager_rows() -> None:
        inputs_jobs = {b: pool.submit(predict_inputs_job, pred_params[b], spec_gpu) for b in batches}

        knee = measure_knee(
            device,
            tokens=256 if smoke else 8192,
            widths=[32, 64, 128] if smoke else [256, 512, 768, 1024, 1536, 2048],
            reps=5 if smoke else 20,
        )
        write_json(args.out / "knee.json", knee)
        threshold = knee["knee_flops"] or ac_selective.DEFAULT_MM_FLOPS_THRESHOLD
        print(f"knee: {knee['knee_flops']} FLOPs (threshold used: {threshold:.3g})", flush=True)

        def peak_of(policy: str, b: int) -> int | None:
            for r in rows:
                if r["policy"] == policy and r["batch_size"] == b:
                    return r["peak_allocated_bytes"]
            return None

        def selective(w: Any) -> dict[str, Any]:
            ac_selective.checkpoint_selective(w.model, threshold)
            return {"mm_flops_threshold": threshold}

        inputs: dict[int, Any] = {}
        plan_jobs: dict[tuple[int, int], Any] = {}
        small = batches[0]
        for b in batches:
            rows.append(run_row("none", params[b], steps))
            try:
                capture = capture_times(params[b])
            except Exception as exc:  # the plan falls back to estimated op times
                print(f"capture failed ({type(exc).__name__}: {exc}); ac-budget uses estimated times")
                capture = None
            rows.append(
                run_row("ac-full", params[b], steps, lambda w: ac_full.patch(Target(w.model)) and None)
            )
            rows.append(
                run_row("torchtitan-op-sac", params[b], steps, lambda w: apply_torchtitan(w.model) and None)
            )
            rows.append(run_row("ac-selective", params[b], steps, selective))
            write_json(args.out / "summary.json", rows)
            # this batch's budgets: its plans are checked on the CPU workers while the GPU goes on
            predicted = inputs_jobs[b].result()
            inputs[b] = predicted
            if capture is not None:
                inputs[b] = with_capture_times(predicted, capture, f"{predicted.container}.0")
            del capture
            if smoke:  # no measured peaks on a CPU: fractions of the predicted activations
                fractions = ("0.95", "0.9", "0.85", "0.8", "0.75") if b == small else ("0.9",)
                listed = [ac_budget.budget_bytes(f, inputs[b]) for f in fractions]
            else:
                full_peak = peak_of("ac-full", b)
                listed = [peak_of("torchtitan-op-sac", b), full_peak]
                if full_peak:  # within 1% of ac-full's measured peak: the prediction's accuracy
                    listed.append(int(full_peak * 1.01))
                if b == small:
                    listed += [int(g * GIB) for g in (27, 25, 22, 20, 18.5, 17)]
            for budget in dict.fromkeys(x for x in listed if x):
                plan_jobs[(b, budget)] = pool.submit(
                    verified_plan_job, pred_params[b], spec_gpu, inputs[b], budget, overhead_us
                )

        for (b, budget), job in plan_jobs.items():
            plan, verified, error = job.result()
            if plan is None:
                rows.append({"policy": "ac-budget", "batch_size": b, "budget_bytes": budget, "error": error})
                print(f"ac-budget b{b} @ {budget / GIB:.2f} GiB: {error}", flush=True)
                continue
            fields = plan_fields(plan, inputs[b], verified)

            def budgeted(w: Any, plan: Any = plan, b: int = b, fields: Any = fields) -> dict[str, Any]:
                ac_budget.apply_plan(w.model, inputs[b], plan)
                return fields

            row = run_row("ac-budget", params[b], steps, budgeted)
            row["budget_bytes"] = budget
            rows.append(row)
            write_json(args.out / "summary.json", rows)

    def write() -> None:
        write_json(args.out / "summary.json", kept + rows)

    if args.only_compiled:
        summary = args.out / "summary.json"
        if summary.exists():
            kept = [
                r for r in json.loads(summary.read_text()) if not r["policy"].startswith("compiled-")
            ]
    else:
        eager_rows()
    backend = "aot_eager_decomp_partition" if smoke else "inductor"
    small = batches[0]
    if not args.skip_compiled:
        compiled_rows(
            params[small], pred_params[small], steps, pool, spec_gpu, backend, smoke, rows, write,
            ratios, fused_loss_ratios, float8_ratios,
        )
    pool.shutdown()

    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "sac_op_overhead_us": overhead_us,
        "batches": list(batches),
        "commit": levers_commit_id(),
        "torch": torch.__version__,
        "gpu": gpu_name,
        "workload": "hf",
        "arch": "llama",
        "size": size,
        "seq_len": None,
        "steps_per_row": steps,
        "warmup_steps": WARMUP_STEPS,
        "wall_s": time.perf_counter() - started,
        "command": " ".join(["python", "bench/ac_policies.py", *sys.argv[1:]]),
    }
    from levers.workloads.llama import SIZES

    meta["seq_len"] = SIZES[size].seq_len
    meta["compiled_rows"] = not args.skip_compiled
    meta["compiled_backend"] = backend
    meta["compiled_ratios"] = list(ratios)
    meta["fused_loss_ratios"] = list(fused_loss_ratios)
    meta["float8_ratios"] = list(float8_ratios)
    for row in rows:
        row.update(
            {"commit": meta["commit"], "torch": meta["torch"], "gpu": gpu_name, "date": meta["date"]}
        )
    write()
    write_json(args.out / ("meta_compiled.json" if args.only_compiled else "meta.json"), meta)
    frontier_svg([r for r in kept + rows if "tokens_per_s" in r], args.out / "frontier.svg")
    print(f"wrote {args.out}/summary.json, frontier.svg in {meta['wall_s']:.0f} s")


if __name__ == "__main__":
    main()
