"""Benchmark: levers' stack against the peers (HF default, Liger Kernel, torch.compile), one run.

    # on the H200 (two calls stay under 10 minutes each; results merge by workload and variant)
    PYTHONPATH=src python bench/levers_vs_peers.py --only llama
    PYTHONPATH=src python bench/levers_vs_peers.py --only qwen2,demo
    PYTHONPATH=src python bench/levers_vs_peers.py --only vit
    # float8 on top of compile-blocks (torchao carried as a wheel, see below), in one call
    PYTHONPATH=/tmp/site:src python bench/levers_vs_peers.py --only llama:lever:compile-blocks,\
        llama:lever:float8,llama:lever:float8-rowwise,llama:torchtitan-float8
    # a tiny CPU run of every row (the test suite runs it)
    PYTHONPATH=src python bench/levers_vs_peers.py --smoke --out /tmp/lvp --catalogue-out /tmp/lvc

Workloads (``--only`` takes group names or ``group:variant``): ``llama`` and ``qwen2`` are the
``hf`` workload at size=1b (batch 4, seq 2048, bf16 autocast, fused AdamW); ``demo`` is the demo
at size=1b (batch 8); ``vit`` is the ``zoo`` workload's timm ``vit_base_patch16_224`` at
size=full (batch 64 at 224 x 224, 12 blocks, bf16 autocast, fused AdamW; issue 21: a host-bound
step), measured beside the three ways users compile it: per block (``compile-layers``), the whole
model in inductor's default mode (``compile-model``) and with CUDA graphs (``compile-model-ro``:
``mode="reduce-overhead"``, ``torch.compiler.cudagraph_mark_step_begin()`` before each step and
the loss cloned, as the CUDA-graph trees documentation asks); ``lever:compile-model`` is levers'
lever at ``mode=auto`` (the row's ``compile_model_mode`` says what it chose, and why), and
``levers-stack`` what the audit recommends there. ``--smoke`` without timm installed (it needs
torchvision) runs transformers' ViT of the same tiny shape instead. Every variant is built fresh
from the same seed, in this process, after ``torch._dynamo.reset()``; a variant that raises is a row with its error. Optional variants
run only when ``--only`` names them: ``lever:float8`` and ``lever:float8-rowwise`` (each float8
recipe on top of compile-blocks, measured against the ``lever:compile-blocks`` row of the same
run, which ``--only`` must name too: their catalogue rows are float8's own effect on a compiled
step), ``torchtitan-float8`` (the peer: torchao's tensorwise float8 on every linear its
``_auto_filter_for_recipe`` takes but the head, then per-layer compile, as torchtitan ships it)
and ``levers-stack+float8``; issue 21's goal table (``goal_rows`` in ``bench/gpu_round.sh``):
the peers ``compile-layers+liger-flce`` and ``torchtitan-float8+liger-flce`` (Liger's fused
linear cross-entropy alone, then per-layer compile), each also at the batches a user would pick
by hand (``@b32``, ``@b48``), beside ``levers-float8`` (float8 and compile-blocks),
``levers-stack+float8`` and ``levers-stack+float8+raise-batch`` (the batch levers memory
predicts to fit, up to ``--max-batch-size``); on ``vit``, ``levers-stack+sdpa-cudnn`` (the stack with every SDPA
call admitting cuDNN's attention first) and ``levers-stack-max-autotune`` (compile-model with
``mode=max-autotune``: CUDA graphs and autotuned matmuls, minutes of compile) and
``levers-stack+float8`` (float8 on the linears torchao's filter takes, under compile-model).

Per row: the median tokens/s of ``--steps`` timed steps after ``--warmup`` steps (compile time
falls in the warm-up), its CI95 by bootstrap over steps, the per-step peak allocated (peak stats
reset before each step; median) and the largest reserved, and

    MFU = F_baseline * (batch / batch_baseline) / step_time / 989.4e12

where F_baseline is the FLOPs of one step of the workload's default variant as counted by
``torch.utils.flop_counter.FlopCounterMode`` (matmuls and attention, forward and backward), so
every row of a workload is credited the same useful work per sample whatever its kernels
recompute, and 989.4 TFLOP/s is the H200's dense bf16 peak.

Writes, after every row (a run cut short keeps what it measured), ``OUT/summary.json`` (the rows,
merged with rows already there) and ``CATALOGUE_OUT/catalogue.json`` (each lever's and stack's
tokens/s ratio and memory change against its workload's default, with CI95), which ``levers
list`` reads.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import importlib.util
import json
import math
import random
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import levers  # noqa: E402
from levers.environment import levers_commit_id  # noqa: E402
from levers.levers import REGISTRY, load_all  # noqa: E402
from levers.loader import load_workload  # noqa: E402
from levers.output.atomic import atomic_write_text  # noqa: E402

PEAK_BF16_FLOPS = 989.4e12  # H200 SXM dense bf16
NUM_RESAMPLES = 2000
HF_STACK = ("compile-blocks", "fused-linear-cross-entropy", "rms-norm-fused", "fused-optimizer")
DEMO_FIXES = "suffix_attn,vit_attn,norm,loss,clone,peak_metric"  # what the demo levers fix
DEMO_LEVERS = (
    "sdpa-cudnn-backend", "sdpa-attention", "rms-norm-fused", "loss-valid-rows",
    "inplace-scatter", "windowed-peak-metric",
)
DEMO_STACK = (*DEMO_LEVERS, "compile-blocks")
# what the audit recommends on the ViT's GPU step: HOST001 (launch gaps) and ELEM001/NORM001 name
# compile-model, which covers the fused-norm levers; its AdamW is fused already (OPT001 is silent)
VIT_STACK = ("compile-model",)
# the batches at which the goal table times the peers (a user raising the batch by hand)
PEER_BATCHES = (32, 48)
HF_SINGLES = (
    "rms-norm-fused", "sdpa-cudnn-backend", "fused-linear-cross-entropy", "liger-kernels",
    "compile-blocks", "fused-optimizer", "autocast-bf16",
)


# -- variants: name -> how to build it ------------------------------------------------------


def _liger(workload, **patches: bool) -> Callable[[], None]:
    """Liger Kernel as its users apply it (all its patches for the model type, on the instance,
    or those ``patches`` turns on or off); the modeling module's globals that it replaces are put
    back when the row ends."""
    import liger_kernel.transformers as liger

    from levers.levers.liger_kernels import restore_classes, restore_globals, snapshot_classes

    model = workload.model
    modeling = sys.modules[type(model).__module__]
    saved, classes = dict(vars(modeling)), snapshot_classes(modeling)
    class_names = {type(m): type(m).__name__ for m in model.modules()}
    getattr(liger, f"apply_liger_kernel_to_{model.config.model_type}")(model=model, **patches)

    def restore() -> None:
        restore_globals(modeling, saved)
        restore_classes(classes)
        for cls, name in class_names.items():
            cls.__name__ = name

    return restore


# Liger's fused linear cross-entropy alone (the peer of levers' fused-linear-cross-entropy): the
# loss patched, the blocks left to per-layer compile
LIGER_FLCE_ONLY = {"rope": False, "rms_norm": False, "swiglu": False, "cross_entropy": False,
                   "fused_linear_cross_entropy": True}


def _torchtitan_float8(workload) -> None:
    """torchtitan's float8 converter as it ships (``auto_filter_small_kn`` and the output head
    in ``filter_fqns``), with torchao called directly."""
    from torchao.float8 import (
        Float8LinearConfig, _auto_filter_for_recipe, convert_to_float8_training,
    )

    config = Float8LinearConfig.from_recipe_name("tensorwise")
    small = _auto_filter_for_recipe("tensorwise", filter_fqns=["lm_head"])
    convert_to_float8_training(workload.model, config=config, module_filter_fn=small)


def _compile_model(workload, options) -> None:
    workload.model.compile(**options)


def _compile_model_cuda_graphs(workload, options) -> None:
    """The whole model compiled with CUDA graphs as the CUDA-graph trees documentation shows it:
    each step marked as a new one, its output copied before the next replay overwrites it."""
    workload.model.compile(mode="reduce-overhead", **options)
    step = workload.step

    def graph_step():
        torch.compiler.cudagraph_mark_step_begin()
        return step().clone()

    workload.step = graph_step


def _compile_loss(workload, options) -> Callable[[], None]:
    """torchtitan's compiled loss (``compile.components`` holds ``loss``): the Hugging Face
    model's own loss function under ``torch.compile``, where the model computes its loss through
    ``self.loss_function``; the undo gives it transformers' back. Elsewhere nothing."""
    model = workload.model
    if not hasattr(model, "loss_function") or "_loss_function" in vars(model):
        return lambda: None
    model.loss_function = torch.compile(model.loss_function, **options)
    return lambda: vars(model).pop("_loss_function", None)


def _compile_layers(workload, options) -> None:
    from levers.blocks import repeated_blocks

    for block in repeated_blocks(workload.model):
        block.module.compile(**options)


def apply_peer(peer: str, workload, options) -> list[Callable[[], None]]:
    """A peer's transforms, ``+``-joined, in order (Liger's patches and float8's conversion before
    compile); the undos of those that patch process-wide state."""
    compile_options = {k: v for k, v in options.items() if k == "backend"}
    cleanups: list[Callable[[], None]] = []
    for part in peer.split("+"):
        if part == "liger":
            cleanups.append(_liger(workload))
        elif part == "liger-flce":
            cleanups.append(_liger(workload, **LIGER_FLCE_ONLY))
        elif part == "float8-torchtitan":
            _torchtitan_float8(workload)
        elif part == "compile-model":
            _compile_model(workload, compile_options)
        elif part == "compile-model-ro":
            _compile_model_cuda_graphs(workload, compile_options)
        elif part == "compile-layers":
            _compile_layers(workload, compile_options)
        elif part == "compile-loss":
            cleanups.append(_compile_loss(workload, compile_options))
        else:
            raise ValueError(f"unknown peer transform {part!r} in {peer!r}")
    return cleanups


def _compile_model_mode(workload, options) -> tuple[str, list[str]]:
    """The mode compile-model chose (``mode=auto``: reduce-overhead on a static step) and why."""
    from levers.levers.compile_model import inductor_mode, static_step_reasons

    reasons = static_step_reasons(workload.model)
    return inductor_mode(str(options.get("mode", "auto")), reasons), reasons


def variants_of(group: str, smoke: bool) -> dict[str, dict[str, Any]]:
    """Each variant: factory params (over the group's), levers to apply, or a peer transform."""
    if group == "demo":
        out: dict[str, dict[str, Any]] = {
            "default": {},
            "fixed-matching": {"params": {"fixed": DEMO_FIXES}},
            "fixed-all": {"params": {"fixed": "all"}},
            "compile-model": {"peer": "compile-model"},
        }
        out.update({f"lever:{i}": {"levers": [i]} for i in DEMO_LEVERS})
        out["levers-stack-no-compile"] = {"levers": list(DEMO_LEVERS)}
        out["levers-stack"] = {"levers": list(DEMO_STACK)}
        out["levers-stack+raise-batch"] = {"levers": list(DEMO_STACK), "raise_batch": True}
        return out
    if group == "vit":
        return {
            "default": {},
            "compile-layers": {"peer": "compile-layers"},
            "compile-model": {"peer": "compile-model"},
            "compile-model-ro": {"peer": "compile-model-ro"},
            "lever:compile-model": {"levers": ["compile-model"]},  # mode=auto
            "levers-stack": {"levers": list(VIT_STACK)},
            # the optional rows are read against the stack they add to (compile-model)
            "levers-stack+sdpa-cudnn": {"levers": ["sdpa-cudnn-backend", *VIT_STACK],
                                        "optional": True, "baseline": "lever:compile-model"},
            # CUDA graphs with inductor's matmul templates autotuned: minutes of compile
            "levers-stack-max-autotune": {"levers": list(VIT_STACK),
                                          "options": {"mode": "max-autotune"}, "optional": True},
            # float8 on the linears torchao's filter takes (qkv and fc1 at ViT-B's widths),
            # under compile-model's CUDA graphs
            "levers-stack+float8": {"levers": ["float8", *VIT_STACK], "optional": True,
                                    "baseline": "lever:compile-model"},
        }
    out = {
        "default": {},
        "liger": {"peer": "liger"},
        "compile-model": {"peer": "compile-model"},
        "compile-layers": {"peer": "compile-layers"},
        "levers-stack": {"levers": list(HF_STACK)},
        "levers-stack+raise-batch": {"levers": list(HF_STACK), "raise_batch": True},
    }
    if group == "llama":
        out.update({f"lever:{i}": {"levers": [i]} for i in HF_SINGLES})
        # run only when named in --only: the stack with the PyTorch loss instead of Liger's
        out["levers-stack-chunked-lce"] = {"levers": list(HF_STACK), "options": {"kernel": "chunked"},
                                           "optional": True}
        # float8 pays compiled: each recipe on top of compile-blocks, against compile-blocks
        for recipe in ("float8", "float8-rowwise"):
            out[f"lever:{recipe}"] = {"levers": [recipe, "compile-blocks"], "optional": True,
                                      "baseline": "lever:compile-blocks"}
    else:  # one more architecture: the peers and the stack only, to stay in the time budget
        del out["compile-model"]
    out.update(float8_variants())
    return out


def float8_variants() -> dict[str, dict[str, Any]]:
    """Issue 21's goal table, run only when named: torchtitan's recipe and per-layer compile with
    Liger's fused linear cross-entropy (the peers), at batch 4 and at the larger batches a peer
    would pick by hand; levers' float8 stack at batch 4 and with raise-batch; two candidates on
    top of float8 and compile-blocks."""
    optional = {"optional": True}
    out: dict[str, dict[str, Any]] = {
        "compile-layers+liger-flce": {"peer": "liger-flce+compile-layers", **optional},
        "torchtitan-float8": {"peer": "float8-torchtitan+compile-layers", **optional},
        "torchtitan-float8+liger-flce": {"peer": "liger-flce+float8-torchtitan+compile-layers",
                                         **optional},
    }
    for batch in PEER_BATCHES:
        for name in ("compile-layers+liger-flce", "torchtitan-float8+liger-flce"):
            out[f"{name}@b{batch}"] = {**out[name], "params": {"batch_size": batch}}
    out["levers-float8"] = {"levers": ["float8", "compile-blocks"], **optional}
    out["levers-stack+float8"] = {"levers": ["float8", *HF_STACK], **optional}
    out["levers-stack+float8+raise-batch"] = {"levers": ["float8", *HF_STACK], "raise_batch": True,
                                              **optional}
    out["levers-float8+sdpa-cudnn"] = {"levers": ["sdpa-cudnn-backend", "float8", "compile-blocks"],
                                       **optional}
    out["levers-float8+adamw-bf16-state"] = {
        "levers": ["adamw-bf16-state", "float8", "compile-blocks"], **optional
    }
    return out


def group_params(group: str, smoke: bool, device: str) -> tuple[str, dict[str, Any]]:
    size = "tiny" if smoke else "1b"
    if group == "demo":
        return "demo", {"size": size, "device": device}
    if group == "vit":
        # a smoke run without timm (it needs torchvision) exercises the rows on transformers' ViT
        # of the same tiny shape; the rows' shape says which model ran
        model = "timm-vit" if not smoke or importlib.util.find_spec("timm") else "vit"
        return "zoo", {"model": model, "size": "tiny" if smoke else "full", "device": device}
    return "hf", {"arch": group, "size": size, "device": device}


# -- measuring --------------------------------------------------------------------------------


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()  # sync point: the step's end, for its wall time


def _step_flops(workload) -> float:
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        workload.step()
    return float(counter.get_total_flops())


def _bootstrap(values_a: list[float], values_b: list[float] | None, stat, rng) -> list[float]:
    out = []
    for _ in range(NUM_RESAMPLES):
        a = [rng.choice(values_a) for _ in values_a]
        if values_b is None:
            out.append(stat(a))
        else:
            out.append(stat(a, [rng.choice(values_b) for _ in values_b]))
    out.sort()
    return [out[int(0.025 * len(out))], out[int(0.975 * len(out)) - 1]]


# the most steps min_timed_s may ask for
MAX_TIMED_STEPS = 1000


def steps_to_fill(num_steps: int, min_timed_s: float, step_s: float, most: int) -> int:
    """``num_steps``, or as many more as fill ``min_timed_s`` at ``step_s`` a step (at most
    ``most``); ``num_steps`` where either is not positive."""
    if min_timed_s > 0 and step_s > 0:
        return min(max(num_steps, math.ceil(min_timed_s / step_s)), most)
    return num_steps


def measure(workload, num_warmup: int, num_steps: int, min_timed_s: float = 0.0) -> dict[str, Any]:
    """``num_steps`` timed steps after ``num_warmup``; with ``min_timed_s``, as many more as
    fill that long at the pace of the last warm-up step (at most MAX_TIMED_STEPS): ten steps of
    5 ms are 50 ms of timing, too little to tell two variants 5% apart."""
    device = workload.device
    start = time.perf_counter()
    last_s = 0.0
    for _ in range(num_warmup):
        begin = time.perf_counter()
        workload.step()
        _sync(device)
        last_s = time.perf_counter() - begin
    _sync(device)
    warmup_s = time.perf_counter() - start
    num_steps = steps_to_fill(num_steps, min_timed_s, last_s, MAX_TIMED_STEPS)
    durations, peaks_allocated, peaks_reserved = [], [], []
    for _ in range(num_steps):
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        _sync(device)
        begin = time.perf_counter()
        loss = workload.step()
        _sync(device)
        durations.append(time.perf_counter() - begin)
        if device.type == "cuda":
            peaks_allocated.append(torch.cuda.max_memory_allocated())
            peaks_reserved.append(torch.cuda.max_memory_reserved())
    tokens = workload.tokens_per_step or 0
    return {
        "warmup_s": warmup_s,
        "dur_s": durations,
        "tokens_per_s_samples": [tokens / d for d in durations],
        "peak_allocated_samples": peaks_allocated,
        "peak_reserved_bytes": max(peaks_reserved) if peaks_reserved else None,
        "last_loss": float(torch.as_tensor(loss).float()),
    }


def run_variant(group: str, name: str, spec: dict[str, Any], args, options) -> dict[str, Any]:
    workload_name, params = group_params(group, args.smoke, args.device)
    params = {**params, **spec.get("params", {})}
    lever_ids = list(spec.get("levers", []))
    lever_options = {**options, **spec.get("options", {})}
    row: dict[str, Any] = {"workload": workload_name, "group": group, "variant": name,
                           "levers": lever_ids, "peer": spec.get("peer"),
                           "baseline_variant": spec.get("baseline", "default")}
    cleanups: list[Callable[[], None]] = []
    torch._dynamo.reset()
    if torch.cuda.is_available():
        # what the previous variants left allocated; a peak is only this variant's when it is 0
        row["allocated_before_bytes"] = torch.cuda.memory_allocated()
    try:
        if spec.get("raise_batch"):
            params, said = REGISTRY["raise-batch"].choose_params(
                workload_name, params,
                {"levers": lever_ids, "gpu": args.gpu, "max_batch_size": args.max_batch_size,
                 "max_evaluations": 6},
            )
            row["raise_batch"] = said
            print(f"  {said}", flush=True)
        workload = load_workload(workload_name, params)
        row["batch_size"] = workload.params.get("batch_size")
        row["shape"] = " ".join(f"{k}={v}" for k, v in workload.params.items()
                                if k in ("arch", "model", "size", "batch_size", "seq_len",
                                         "fixed"))
        if spec.get("peer"):
            cleanups.extend(apply_peer(spec["peer"], workload, lever_options))
        if lever_ids:
            # a stack skips what does not apply (and says so); a single lever, or the levers of
            # a row measured on top of another, must apply
            strict = len(lever_ids) == 1 or "baseline" in spec
            handle = levers.apply(workload, lever_ids, skip_inapplicable=not strict,
                                  **lever_options)
            # undone when the row ends: a lever's process-wide setting (the compile levers'
            # dynamo flag) must not reach the rows after it
            cleanups.append(handle.undo)
            # copies: the undo clears the handle's own lists
            row["applied"], row["skipped"] = list(handle.applied), dict(handle.skipped)
            if "compile-model" in handle.applied:
                row["compile_model_mode"], row["compile_model_reasons"] = _compile_model_mode(
                    workload, lever_options
                )
        row.update(measure(workload, args.warmup, args.steps))
        row["status"] = "ok"
    except Exception as exc:  # noqa: BLE001 - a failing variant is a result, not a crash
        row["status"] = "not-applicable" if type(exc).__name__ == "NotApplicable" else "failed"
        row["error"] = f"{type(exc).__name__}: {exc}"[:600]
        if args.debug:
            traceback.print_exc()
    finally:
        for cleanup in cleanups:
            try:
                cleanup()
            except Exception as exc:  # noqa: BLE001 - the row's figures stand; say it
                row["cleanup_error"] = f"{type(exc).__name__}: {exc}"[:600]
        workload = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return row


def summarise(rows: list[dict[str, Any]], baseline_flops: dict[str, tuple[float, int]], rng) -> None:
    for row in rows:
        if row.get("status") != "ok":
            continue
        samples = row["tokens_per_s_samples"]
        row["tokens_per_s"] = statistics.median(samples)
        row["tokens_per_s_ci95"] = _bootstrap(samples, None, statistics.median, rng)
        row["step_ms"] = 1e3 * statistics.median(row["dur_s"])
        peaks = row.get("peak_allocated_samples") or []
        row["peak_allocated_bytes"] = statistics.median(peaks) if peaks else None
        flops, batch = baseline_flops.get(row["group"], (None, None))
        if flops and batch and row.get("batch_size"):
            step_flops = flops * row["batch_size"] / batch
            row["flops_per_step"] = step_flops
            row["mfu"] = step_flops / (row["step_ms"] / 1e3) / PEAK_BF16_FLOPS


def catalogue_rows(rows: list[dict[str, Any]], rng) -> list[dict[str, Any]]:
    """One entry per non-default row: its ratio and memory change against its baseline row (its
    group's default, or the variant it is measured on top of; its levers are then the ones it
    adds)."""
    by_group = {(r["group"], r["variant"]): r for r in rows}
    out = []
    for row in rows:
        if row["variant"] == "default":
            continue
        base_variant = row.get("baseline_variant", "default")
        base = by_group.get((row["group"], base_variant))
        if base is None or base.get("status") != "ok":
            continue
        single = row["variant"].startswith("lever:")
        under = set(base.get("levers") or [])
        entry = {
            "lever": row["variant"][len("lever:"):] if single else f"{row['group']}:{row['variant']}",
            "levers": [i for i in row.get("levers") or [] if i not in under],
            "workload": row["workload"],
            "shape": row.get("shape") or base.get("shape"),
            "baseline": f"{row['group']}:{base_variant}",
            "status": "ok" if row.get("status") == "ok" else "failed",
            "error": row.get("error"),
            **{k: row.get(k) for k in ("commit", "torch", "gpu", "date")},
        }
        if row.get("status") == "ok":
            a, b = row["tokens_per_s_samples"], base["tokens_per_s_samples"]
            ratio = lambda x, y: statistics.median(x) / statistics.median(y)  # noqa: E731
            entry["tokens_per_s_ratio"] = ratio(a, b)
            entry["tokens_per_s_ratio_ci95"] = _bootstrap(a, b, ratio, rng)
            pa, pb = row.get("peak_allocated_samples"), base.get("peak_allocated_samples")
            if _under_cuda_graphs(row):
                entry["note"] = UNDER_CUDA_GRAPHS
            elif pa and pb:
                delta = lambda x, y: statistics.median(x) - statistics.median(y)  # noqa: E731
                entry["peak_allocated_delta_bytes"] = delta(pa, pb)
                entry["peak_allocated_delta_ci95"] = _bootstrap(pa, pb, delta, rng)
            if row.get("peak_reserved_bytes") is not None and base.get("peak_reserved_bytes"):
                entry["peak_reserved_delta_bytes"] = (
                    row["peak_reserved_bytes"] - base["peak_reserved_bytes"]
                )
        out.append(entry)
    return out


# a CUDA graph's tensors live in its private memory pool: reserved, but free to the allocator
# between replays, so the peak allocated of such a step is not its memory
UNDER_CUDA_GRAPHS = (
    "peak allocated left out: under CUDA graphs the step's tensors live in the graphs' private "
    "pool, which counts as reserved, not allocated"
)


def _under_cuda_graphs(row: dict[str, Any]) -> bool:
    from levers.levers.compile_model import CUDA_GRAPH_MODES

    return (row.get("compile_model_mode") in CUDA_GRAPH_MODES
            or "compile-model-ro" in (row.get("peer") or "").split("+"))


def _write_json(path: Path, doc: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(doc, indent=2) + "\n")


def _merge(path: Path, rows: list[dict[str, Any]], key) -> list[dict[str, Any]]:
    """Rows already in ``path`` that this run did not redo, then this run's rows."""
    if not path.exists():
        return rows
    old = json.loads(path.read_text(encoding="utf-8"))
    old_rows = old.get("rows", []) if isinstance(old, dict) else old
    redone = {key(r) for r in rows}
    return [r for r in old_rows if key(r) not in redone] + rows


def parse_only(text: str | None, groups: list[str]) -> dict[str, set[str] | None]:
    if not text:
        return {g: None for g in groups}
    chosen: dict[str, set[str] | None] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        group, _, variant = part.partition(":")
        if group not in groups:
            raise SystemExit(f"--only {part}: unknown group {group!r}; groups: {', '.join(groups)}")
        if not variant:
            chosen[group] = None
        elif chosen.get(group, set()) is not None:
            chosen.setdefault(group, set()).add(variant)  # type: ignore[union-attr]
    return chosen


def write_results(rows: list[dict[str, Any]], flops: dict[str, tuple[float, int]], args,
                  meta: dict[str, Any]) -> None:
    """The rows so far, summarised and merged with those in ``OUT/summary.json``, and the
    catalogue of the merged rows; the same figures however often it is called."""
    rng = random.Random(0)
    summarise(rows, flops, rng)
    for row in rows:
        row["mfu_formula"] = ("FlopCounterMode FLOPs of the default step x batch/batch_default "
                              "/ step time / 989.4e12 (H200 dense bf16)")
    key = lambda r: (r.get("group"), r.get("variant"))  # noqa: E731
    summary = _merge(args.out / "summary.json", rows, key)
    _write_json(args.out / "summary.json", {"rows": summary, "command": " ".join(sys.argv)})
    catalogue = catalogue_rows(summary, rng)
    _write_json(args.catalogue_out / "catalogue.json",
                {"rows": catalogue, "command": " ".join(sys.argv), **meta})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", help="groups (llama, qwen2, demo, vit) or group:variant, "
                        "comma-separated")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU, aot_eager compile")
    parser.add_argument("--steps", type=int, default=None, help="timed steps (default 10; smoke 3)")
    parser.add_argument("--warmup", type=int, default=None, help="warm-up steps (default 3; smoke 1)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/levers_vs_peers_h200")
    parser.add_argument("--catalogue-out", type=Path,
                        default=ROOT / "bench/results/levers_catalogue_h200")
    parser.add_argument("--gpu", default=None, help="raise-batch's target (default: this GPU)")
    parser.add_argument("--max-batch-size", type=int, default=32)
    parser.add_argument("--debug", action="store_true", help="print tracebacks of failing rows")
    args = parser.parse_args(argv)
    args.device = "cpu" if args.smoke else "cuda"
    args.steps = args.steps or (3 if args.smoke else 10)
    args.warmup = args.warmup or (1 if args.smoke else 3)
    if args.smoke and args.gpu is None:
        args.gpu = "2GiB"
        args.max_batch_size = 4
    if not args.smoke and not torch.cuda.is_available():
        raise SystemExit("this benchmark runs on a CUDA GPU; use --smoke for a CPU run")
    options = {"backend": "aot_eager"} if args.smoke else {}
    load_all()
    groups = ["llama", "qwen2", "demo", "vit"]
    chosen = parse_only(args.only, groups)
    device = torch.device(args.device)
    meta = {
        "commit": levers_commit_id() or "unknown",
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    try:
        import transformers

        meta["transformers"] = transformers.__version__
    except ImportError:
        pass
    rows: list[dict[str, Any]] = []
    flops: dict[str, tuple[float, int]] = {}
    started = time.perf_counter()
    for group in groups:
        if group not in chosen:
            continue
        variants = variants_of(group, args.smoke)
        wanted = chosen[group]
        names = [n for n in variants
                 if n == "default" or (n in wanted if wanted is not None
                                       else not variants[n].get("optional"))]
        for name in names:
            t0 = time.perf_counter()
            print(f"{group}:{name} ...", flush=True)
            row = run_variant(group, name, variants[name], args, options)
            # the variant's model, optimizer and compiled code hold reference cycles: collect
            # them here, after its frame is gone, so the next variant's peak is its own
            torch._dynamo.reset()
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            row.update(meta)
            rows.append(row)
            print(f"  {row['status']} in {time.perf_counter() - t0:.0f}s "
                  f"{row.get('error') or ''}", flush=True)
            if name == "default" and row["status"] == "ok":
                workload_name, params = group_params(group, args.smoke, args.device)
                with contextlib.suppress(Exception):
                    flops[group] = (_step_flops(load_workload(workload_name, params)),
                                    row["batch_size"])
            # after every row, so that a run cut short by its time limit keeps the rows it made
            write_results(rows, flops, args, meta)
    write_results(rows, flops, args, meta)
    print(f"wrote {args.out / 'summary.json'} and {args.catalogue_out / 'catalogue.json'} "
          f"in {time.perf_counter() - started:.0f}s")
    for row in rows:
        if row["status"] == "ok":
            mfu = f"{100 * row['mfu']:.1f}% MFU" if row.get("mfu") else ""
            print(f"{row['group']:>6} {row['variant']:<28} b={row['batch_size']:<3} "
                  f"{row['tokens_per_s']:>10.0f} tok/s  {mfu}")
        else:
            print(f"{row['group']:>6} {row['variant']:<28} {row['status']}: {row.get('error')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
