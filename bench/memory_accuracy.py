"""How close ``levers memory``'s CPU prediction is to the real peaks on a GPU.

For each configuration, two fresh processes:

- the prediction, with CUDA hidden (``CUDA_VISIBLE_DEVICES=""``), by the same code path a
  CPU-only machine takes: ``levers.memory.predict_memory(spec, gpu=<this GPU>)``;
- the measurement: build the workload on the GPU, run the same number of steps, read
  ``torch.cuda.max_memory_allocated()`` and ``max_memory_reserved()``.

It writes one row per configuration (git commit, torch version, GPU, config, predicted and
measured allocated and reserved peaks, errors in %) to ``OUT/memory_accuracy.json`` and
``.csv``. With ``--calibrate`` it also records, per configuration, a per-op log of the real
step (allocated before/after and the peak inside every aten op) and the allocator's own event
trace, and probes the SDPA backend choice, the cuBLAS workspaces and the caching allocator on
known sequences (``OUT/memory_calibration.json``, ``OUT/memory_oplogs.json.gz``).
``--fit`` runs the batch sizes around a ``--fit`` prediction for real (see ``fit_check``).
``--segments`` writes, per configuration, the caching allocator's segments as measured (the
segments at the end of the run, which are the segments at the reserved peak, since none is
released; and for each ``cudaMalloc`` the request that caused it and the Python frames that
made it) and as the allocator model replays them (for each new segment, the allocation that
caused it), to ``OUT/memory_segments.json``: where a reserved peak is under-predicted, the
segments the model lacks show what it misses.

Usage (on the GPU machine, from the repository root):

    python bench/memory_accuracy.py --out OUT [--calibrate] [--segments] [--only NAME,...] [--jobs 4]
"""

from __future__ import annotations

import argparse
import concurrent.futures as futures
import csv
import gc
import gzip
import json
import os
import random
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

GIB = 1 << 30
NUM_STEPS = 3
VISION = str(ROOT / "bench" / "vision_workloads.py")
TEXT = str(ROOT / "bench" / "text_workloads.py")

# name, spec, params, rough GiB on the GPU (for scheduling concurrent measurements)
CONFIGS = [
    ("demo-tiny-b2", "demo", {"size": "tiny", "batch_size": 2}, 1),
    ("demo-tiny-b8", "demo", {"size": "tiny", "batch_size": 8}, 1),
    ("demo-1b-b4", "demo", {"size": "1b", "batch_size": 4}, 28),
    ("demo-1b-b8", "demo", {"size": "1b", "batch_size": 8}, 34),
    ("llama-tiny-b2", "llama", {"size": "tiny", "batch_size": 2}, 1),
    ("llama-tiny-b8", "llama", {"size": "tiny", "batch_size": 8}, 1),
    ("llama-1b-b2", "llama", {"size": "1b", "batch_size": 2}, 23),
    ("llama-1b-b4", "llama", {"size": "1b", "batch_size": 4}, 33),
    (
        "hf-llama-1b-eager-b1",
        "hf",
        {"arch": "llama", "attn": "eager", "size": "1b", "batch_size": 1},
        25,
    ),
    (
        "hf-llama-1b-sdpa-b2",
        "hf",
        {"arch": "llama", "attn": "sdpa", "size": "1b", "batch_size": 2},
        24,
    ),
    (
        "demo-1b-b8-checkpointing",
        "demo",
        {"size": "1b", "batch_size": 8, "fixed": "checkpointing"},
        24,
    ),
    ("llama-8b-bf16-b1", "llama", {"size": "8b", "dtype": "bfloat16", "batch_size": 1}, 86),
    # vision and convolution (bench/vision_workloads.py): the patch-embedding and conv
    # workspaces, and many mid-sized activation blocks, stress the allocator model otherwise
    ("vit-b16-timm-b64", VISION + ":vit", {"batch_size": 64, "impl": "timm"}, 30),
    ("vit-b16-standin-b64", VISION + ":vit", {"batch_size": 64, "impl": "standin"}, 30),
    ("resnet50-timm-b64", VISION + ":convnet", {"batch_size": 64, "impl": "timm"}, 24),
    ("resnet50-standin-b64", VISION + ":convnet", {"batch_size": 64, "impl": "standin"}, 24),
    # transformers GPT-2 (bench/text_workloads.py): a bias gradient on every linear
    ("gpt2-medium8-b8", TEXT + ":gpt2", {"batch_size": 8, "size": "medium8"}, 30),
    # a Hugging Face mixture of experts (the zoo's mixtral, full: ~0.8e9 parameters, 8 experts,
    # 2 per token): the router's integer histogram and the experts' grouped matmuls
    ("mixtral-zoo-b4", "zoo", {"model": "mixtral", "size": "full", "batch_size": 4}, 20),
    ("mixtral-zoo-b16", "zoo", {"model": "mixtral", "size": "full", "batch_size": 16}, 40),
    # other batches of the same models, for the convolution workspaces' dependence on shape
    ("vit-b16-timm-b32", VISION + ":vit", {"batch_size": 32, "impl": "timm"}, 16),
    ("vit-b16-timm-b128", VISION + ":vit", {"batch_size": 128, "impl": "timm"}, 56),
    ("resnet50-timm-b32", VISION + ":convnet", {"batch_size": 32, "impl": "timm"}, 14),
    ("resnet50-timm-b128", VISION + ":convnet", {"batch_size": 128, "impl": "timm"}, 44),
]
# the tiny shapes of the same workloads, for a CPU check that the configurations build
SMOKE_CONFIGS = [
    ("vit-tiny-standin-b2", VISION + ":vit", {"batch_size": 2, "size": "tiny", "impl": "standin"}),
    ("convnet-tiny-standin-b2", VISION + ":convnet", {"batch_size": 2, "size": "tiny", "impl": "standin"}),
    ("gpt2-tiny-b2", TEXT + ":gpt2", {"batch_size": 2, "size": "tiny"}),
]


def _config(name: str) -> tuple[str, dict, int]:
    for config_name, spec, params, gib in CONFIGS:
        if config_name == name:
            return spec, params, gib
    raise SystemExit(f"unknown config {name!r}")


# The --fit check: predict the largest batch that fits a budget, then run it and the next
# larger one on the GPU, with the allocator capped at the budget and without a cap.
FIT_CHECK = ("llama", {"size": "1b"}, "batch_size", "40GiB", 0.05)

# --- workers (each runs in its own process) ------------------------------------------------


def predict_worker(name: str, gpu: str, segments: bool = False) -> dict:
    import torch

    from levers.memory import predict_memory

    torch.set_num_threads(1)
    spec, params, _ = _config(name)
    plan = predict_memory(spec, gpu, params=params, num_steps=NUM_STEPS)
    extra = {"segments": predicted_segments(spec, params, gpu)} if segments else {}
    return {
        **extra,
        "predicted_allocated_bytes": plan.peak_allocated_bytes,
        "predicted_reserved_bytes": plan.peak_reserved_bytes,
        "by_category": {c.category: c.nbytes for c in plan.by_category},
        "peak": [plan.peak.phase, plan.peak.step, plan.peak.module, plan.peak.op],
        "attention": [[a.backend, a.num_calls, a.example] for a in plan.attention],
        "assumptions": list(plan.assumptions),
        "predict_seconds": plan.seconds,
        "cuda_available_in_predictor": torch.cuda.is_available(),
    }


def predicted_segments(spec: str, params: dict, gpu: str) -> list:
    """Each segment the allocator model creates, in order: [segment bytes, request bytes,
    category, phase, step, module, op] of the allocation that made it."""
    from levers.hardware import resolve_gpu
    from levers.memory.allocator import CachingAllocator
    from levers.memory.prediction import run_prediction, source_of

    prediction = run_prediction(source_of(spec, params), resolve_gpu(gpu), num_steps=NUM_STEPS)
    trace = prediction.trace
    allocator = CachingAllocator()
    made = []
    for event in trace.events:
        handle = abs(event)
        if event > 0:
            allocation = trace.allocations[handle - 1]
            before = allocator.reserved_bytes
            allocator.malloc(handle, allocation.nbytes)
            if allocator.reserved_bytes > before:
                made.append(
                    [
                        allocator.reserved_bytes - before,
                        allocation.nbytes,
                        allocation.category,
                        allocation.phase,
                        allocation.step,
                        allocation.module,
                        allocation.op,
                    ]
                )
        elif allocator.holds(handle):
            allocator.free(handle)
    return made


def measured_segments(snapshot: dict) -> dict:
    """The segments at the end of the run, and what made each ``cudaMalloc`` (from the
    allocator's history: the request right after each ``segment_alloc``, and its frames)."""
    held = sorted(
        (
            [
                seg.get("segment_type"),
                seg.get("total_size"),
                seg.get("allocated_size"),
                len(seg.get("blocks", [])),
            ]
            for seg in snapshot.get("segments", [])
        ),
        key=lambda row: -row[1],
    )
    made = []
    trace = snapshot.get("device_traces", [[]])[0]
    for index, entry in enumerate(trace):
        if entry.get("action") != "segment_alloc":
            continue
        request = next(
            (e for e in trace[index + 1 : index + 4] if e.get("action") == "alloc"), {}
        )
        frames = [
            f"{Path(f.get('filename', '')).name}:{f.get('line')}:{f.get('name')}"
            for f in (request.get("frames") or entry.get("frames") or [])
            if "memory_accuracy" not in f.get("filename", "")
        ][:6]
        made.append([entry.get("size"), request.get("size"), frames])
    return {"held": held, "made": made}


def fit_worker() -> dict:
    import torch

    from levers.memory.fit import fit_param
    from levers.memory.options import MemoryOptions
    from levers.memory.prediction import source_of

    torch.set_num_threads(1)
    spec, params, param, budget, margin = FIT_CHECK
    options = MemoryOptions.checked(gpu=budget, margin=margin, num_steps=NUM_STEPS)
    result = fit_param(source_of(spec, params), options, param, start=params.get(param, 4))
    return {
        "spec": spec,
        "params": params,
        "param": param,
        "gpu": budget,
        "margin": margin,
        "best": result.best,
        "budget_bytes": result.budget_bytes,
        "curve": [
            [p.value, p.peak_allocated_bytes, p.peak_reserved_bytes, p.fits] for p in result.curve
        ],
        "cuda_available_in_predictor": torch.cuda.is_available(),
    }


def fit_run_worker(value: int, cap_bytes: int) -> dict:
    """Run the fit-check workload with ``param=value``; cap the allocator at ``cap_bytes`` (0: no cap)."""
    import torch

    from levers.loader import load_workload

    spec, params, param, _, _ = FIT_CHECK
    torch.cuda.init()
    total = torch.cuda.get_device_properties(0).total_memory
    if cap_bytes:
        torch.cuda.set_per_process_memory_fraction(cap_bytes / total)
    result = {"value": value, "cap_bytes": cap_bytes, "total_bytes": total}
    try:
        workload = load_workload(spec, {**params, param: value, "device": "cuda"})
        for _ in range(NUM_STEPS):
            workload.step()
        torch.cuda.synchronize()
        result["ran"] = True
    except torch.OutOfMemoryError as exc:
        result["ran"] = False
        result["oom"] = str(exc).splitlines()[0][:300]
    result["max_allocated_bytes"] = torch.cuda.max_memory_allocated()
    result["max_reserved_bytes"] = torch.cuda.max_memory_reserved()
    return result


def measure_worker(name: str, calibrate: bool, segments: bool = False) -> dict:
    import torch

    from levers.loader import load_workload

    spec, params, _ = _config(name)
    torch.cuda.init()
    free_before, total = torch.cuda.mem_get_info()
    if segments:
        # records what each cudaMalloc served; it changes no allocation
        torch.cuda.memory._record_memory_history(
            max_entries=1_000_000, context="alloc", stacks="python"
        )
    workload = load_workload(spec, {**params, "device": "cuda"})
    torch.cuda.synchronize()
    after_build = _memory_now()
    steps = []
    for _ in range(NUM_STEPS):
        workload.step()
        torch.cuda.synchronize()
        steps.append(_memory_now())
    stats = torch.cuda.memory_stats()
    result = {
        "measured_allocated_bytes": torch.cuda.max_memory_allocated(),
        "measured_reserved_bytes": torch.cuda.max_memory_reserved(),
        "after_build": after_build,
        "steps": steps,
        "num_alloc_retries": stats.get("num_alloc_retries", 0),
        "num_ooms": stats.get("num_ooms", 0),
        "memory_stats": {k: v for k, v in stats.items() if isinstance(v, (int, float))},
        "cuda_context_bytes": total - free_before,
    }
    if segments:
        result["segments"] = measured_segments(torch.cuda.memory._snapshot())
        torch.cuda.memory._record_memory_history(enabled=None)
    if calibrate:
        del workload
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        result["oplog"] = _instrumented_run(spec, params)
    return result


def _memory_now() -> list[int]:
    import torch

    return [
        torch.cuda.memory_allocated(),
        torch.cuda.memory_reserved(),
        torch.cuda.max_memory_allocated(),
        torch.cuda.max_memory_reserved(),
    ]


class _SdpaChoiceLog:
    """Records the backend the GPU picks for each SDPA call (forward calls only)."""

    def __init__(self, log: list) -> None:
        self.log = log

    def __enter__(self):
        import torch.nn.functional as F
        from torch.overrides import TorchFunctionMode

        log = self.log

        class Mode(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                if func is F.scaled_dot_product_attention:
                    try:
                        log.append(_sdpa_choice(args, kwargs))
                    except Exception as exc:  # a probe must not change the run
                        log.append({"error": repr(exc)})
                return func(*args, **kwargs)

        self.mode = Mode()
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        self.mode.__exit__(*exc)


def _sdpa_choice(args, kwargs) -> dict:
    import torch

    names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
    call = {
        "attn_mask": None,
        "dropout_p": 0.0,
        "is_causal": False,
        "scale": None,
        "enable_gqa": False,
    }
    call.update(zip(names, args))
    call.update(kwargs)
    q, k, v, mask = call["query"], call["key"], call["value"], call["attn_mask"]
    if torch.is_autocast_enabled("cuda"):
        dtype = torch.get_autocast_dtype("cuda")
        q, k, v = (x.to(dtype) if x.is_floating_point() else x for x in (q, k, v))
        if mask is not None and mask.is_floating_point():
            mask = mask.to(dtype)
    choice = torch._fused_sdp_choice(
        q,
        k,
        v,
        mask,
        call["dropout_p"],
        call["is_causal"],
        scale=call["scale"],
        enable_gqa=call["enable_gqa"],
    )
    return {
        "choice": int(choice),
        "q": [list(q.shape), list(q.stride()), str(q.dtype)],
        "k": [list(k.shape), list(k.stride())],
        "v": [list(v.shape), list(v.stride())],
        "mask": None if mask is None else [list(mask.shape), list(mask.stride()), str(mask.dtype)],
        "is_causal": bool(call["is_causal"]),
        "enable_gqa": bool(call["enable_gqa"]),
        "priority": list(torch._C._get_sdp_priority_order()),
    }


def _allocations_made() -> tuple[int, int]:
    """(allocations made so far, bytes they asked for), from the allocator's counters."""
    import torch

    stats = torch.cuda.memory_stats()
    return stats.get("allocation.all.allocated", 0), stats.get("requested_bytes.all.allocated", 0)


def _call_signature(args: tuple) -> list:
    """Shapes, strides and dtypes of an op's tensor arguments, and its small other arguments."""
    import torch

    signature = []
    for arg in args:
        if isinstance(arg, torch.Tensor):
            signature.append([list(arg.shape), list(arg.stride()), str(arg.dtype)])
        elif isinstance(arg, (int, float, bool, type(None))):
            signature.append(arg)
        elif isinstance(arg, (list, tuple)) and len(arg) <= 8:
            signature.append([a if isinstance(a, (int, float, bool, type(None))) else
                              str(type(a).__name__) for a in arg])
        else:
            signature.append(type(arg).__name__)
    return signature


def _instrumented_run(spec: str, params: dict) -> dict:
    """Per-op memory of the real step, and the allocator's own trace."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten
    from torch.utils.weak import WeakIdKeyDictionary

    from levers.loader import load_workload
    from levers.memory.tracker import SiteContext, install_module_hooks, install_optimizer_hooks

    context = SiteContext()
    rows: list = []
    seen = WeakIdKeyDictionary()
    counter = [0]

    class OpLog(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            before = torch.cuda.memory_allocated()
            made_before = _allocations_made()
            torch.cuda.reset_peak_memory_stats()
            out = func(*args, **(kwargs or {}))
            after = torch.cuda.memory_allocated()
            peak = torch.cuda.max_memory_allocated()
            new_bytes = []
            for tensor in tree_flatten(out)[0]:
                if isinstance(tensor, torch.Tensor) and tensor.is_cuda:
                    storage = tensor.untyped_storage()
                    if storage not in seen:
                        seen[storage] = True
                        new_bytes.append(storage.nbytes())
            counter[0] += 1
            if after == before and peak == before and not new_bytes:
                return out  # a view or an in-place op: nothing to learn
            phase = context.phase()
            row = [
                counter[0],
                context.step,
                phase[0],
                context.module(phase),
                str(func),
                before,
                after,
                peak,
                torch.cuda.memory_reserved(),
                new_bytes,
            ]
            if peak > max(before, after):  # a buffer inside the kernel: say what it ran on
                made_after = _allocations_made()
                # the number and bytes of the op's allocations, outputs and buffers together
                row.append(_call_signature(args))
                row.append([made_after[0] - made_before[0], made_after[1] - made_before[1]])
            rows.append(row)
            return out

    torch.cuda.memory._record_memory_history(max_entries=500_000, context=None, stacks="python")
    base = torch.cuda.memory_allocated()
    sdpa_log: list = []
    with OpLog(), _SdpaChoiceLog(sdpa_log):
        workload = load_workload(spec, {**params, "device": "cuda"})
        names = {id(m): n for n, m in workload.model.named_modules()}

        class _NoTracker:
            def relabel(self, *a, **k):
                pass

        removers = [
            install_module_hooks(context, names),
            install_optimizer_hooks(context, _NoTracker(), workload.optimizer),
        ]
        for step in range(NUM_STEPS):
            context.start_step(step)
            workload.step()
        for remove in removers:
            remove()
    torch.cuda.synchronize()
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    trace = []
    codes = {"alloc": "a", "free_completed": "f", "segment_alloc": "S", "segment_free": "F"}
    for entry in snapshot.get("device_traces", [[]])[0]:
        code = codes.get(entry.get("action"))
        if code is not None:
            trace.append([code, entry.get("size", 0)])
    return {
        "base_allocated_bytes": base,
        "ops": rows,
        "allocator_trace": trace,
        "sdpa_choices": sdpa_log[:256],
    }


def probe_worker() -> dict:
    """SDPA choices on a grid, cuBLAS workspaces, attention kernels' memory, allocator sequences."""
    import torch

    torch.cuda.init()
    free, total = torch.cuda.mem_get_info()
    result = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "device": torch.cuda.get_device_name(),
        "capability": list(torch.cuda.get_device_capability()),
        "total_memory": torch.cuda.get_device_properties(0).total_memory,
        "mem_get_info_after_init": [free, total],
        "sdpa_priority_before": list(torch._C._get_sdp_priority_order()),
    }
    # first, while the allocator holds nothing: its sequences must start from an empty cache
    result["allocator_sequences"] = _probe_allocator()
    result["cublas"] = _probe_cublas()
    result["sdpa_grid"] = _probe_sdpa_grid()
    result["sdpa_priority_after"] = list(torch._C._get_sdp_priority_order())
    result["attention_memory"] = _probe_attention_memory()
    return result


def _probe_cublas() -> dict:
    import torch

    found = {}
    a = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    (a @ a).sum().item()
    found["bf16_mm_main_thread"] = torch.cuda.memory_allocated() - before
    before = torch.cuda.memory_allocated()
    b = torch.randn(256, 256, device="cuda", dtype=torch.float32)
    (b @ b).sum().item()
    found["fp32_mm_main_thread_after_bf16"] = torch.cuda.memory_allocated() - before
    w = torch.randn(256, 256, device="cuda", requires_grad=True)
    x = torch.randn(64, 256, device="cuda")
    y = (x @ w).sum()
    before = torch.cuda.memory_allocated()
    y.backward()
    torch.cuda.synchronize()
    found["backward_thread_mm"] = (
        torch.cuda.memory_allocated() - before - w.grad.untyped_storage().nbytes()
    )
    lin = torch.nn.Linear(256, 256, device="cuda")
    before = torch.cuda.memory_allocated()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = lin(x)
    found["addmm_bias_autocast"] = (
        torch.cuda.memory_allocated() - before - out.untyped_storage().nbytes()
    )
    return found


def _probe_sdpa_grid() -> list:
    import torch

    rows = []
    batch = 2
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for head_dim in (64, 72, 128, 256):
            for heads, kv_heads, gqa in ((16, 16, False), (16, 4, True)):
                for q_len, k_len in ((1024, 1024), (60, 1160)):
                    for mask_kind in ("none", "float", "bool"):
                        for causal in (False, True):
                            for layout in ("bhld", "blhd"):
                                if mask_kind != "none" and causal:
                                    continue
                                rows.append(
                                    _one_choice(
                                        batch,
                                        heads,
                                        kv_heads,
                                        gqa,
                                        q_len,
                                        k_len,
                                        head_dim,
                                        dtype,
                                        mask_kind,
                                        causal,
                                        layout,
                                    )
                                )
    return rows


def _one_choice(
    batch, heads, kv_heads, gqa, q_len, k_len, head_dim, dtype, mask_kind, causal, layout
):
    import torch

    def make(h, length):
        if layout == "bhld":
            return torch.empty(
                batch, h, length, head_dim, device="cuda", dtype=dtype, requires_grad=True
            )
        return (
            torch.empty(batch, length, h, head_dim, device="cuda", dtype=dtype)
            .transpose(1, 2)
            .requires_grad_()
        )

    q, k, v = make(heads, q_len), make(kv_heads, k_len), make(kv_heads, k_len)
    mask = None
    if mask_kind == "float":
        mask = torch.zeros(1, 1, q_len, k_len, device="cuda", dtype=dtype)
    elif mask_kind == "bool":
        mask = torch.ones(batch, 1, q_len, k_len, device="cuda", dtype=torch.bool)
    try:
        choice = int(torch._fused_sdp_choice(q, k, v, mask, 0.0, causal, enable_gqa=gqa))
    except Exception as exc:
        choice = repr(exc)[:80]
    return [
        str(dtype).removeprefix("torch."),
        head_dim,
        heads,
        kv_heads,
        gqa,
        q_len,
        k_len,
        mask_kind,
        causal,
        layout,
        choice,
    ]


def _probe_attention_memory() -> list:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    rows = []
    shapes = [
        (2, 16, 16, 2048, 2048, 128),
        (2, 16, 4, 2048, 2048, 128),
        (4, 16, 16, 1024, 1024, 64),
        (8, 16, 4, 60, 1160, 128),
    ]
    for backend in (
        SDPBackend.FLASH_ATTENTION,
        SDPBackend.EFFICIENT_ATTENTION,
        SDPBackend.CUDNN_ATTENTION,
        SDPBackend.MATH,
    ):
        for batch, heads, kv_heads, q_len, k_len, head_dim in shapes:
            q = torch.randn(
                batch,
                heads,
                q_len,
                head_dim,
                device="cuda",
                dtype=torch.bfloat16,
                requires_grad=True,
            )
            k = torch.randn(
                batch,
                kv_heads,
                k_len,
                head_dim,
                device="cuda",
                dtype=torch.bfloat16,
                requires_grad=True,
            )
            v = torch.randn(
                batch,
                kv_heads,
                k_len,
                head_dim,
                device="cuda",
                dtype=torch.bfloat16,
                requires_grad=True,
            )
            causal = q_len == k_len
            row = [str(backend), batch, heads, kv_heads, q_len, k_len, head_dim, causal]
            try:
                torch.cuda.synchronize()
                base = torch.cuda.memory_allocated()
                torch.cuda.reset_peak_memory_stats()
                with sdpa_kernel([backend]):
                    out = F.scaled_dot_product_attention(
                        q, k, v, is_causal=causal, enable_gqa=heads != kv_heads
                    )
                torch.cuda.synchronize()
                fwd_after, fwd_peak = (
                    torch.cuda.memory_allocated() - base,
                    torch.cuda.max_memory_allocated() - base,
                )
                grad = torch.ones_like(out)
                torch.cuda.synchronize()
                base2 = torch.cuda.memory_allocated()
                torch.cuda.reset_peak_memory_stats()
                out.backward(grad)
                torch.cuda.synchronize()
                bwd_after, bwd_peak = (
                    torch.cuda.memory_allocated() - base2,
                    torch.cuda.max_memory_allocated() - base2,
                )
                row += [fwd_after, fwd_peak, bwd_after, bwd_peak]
                del out, grad
            except Exception as exc:
                row += [repr(exc)[:100]]
            rows.append(row)
            del q, k, v
            gc.collect()
    return rows


def _probe_allocator() -> list:
    """Known allocation sequences and the allocator's allocated/reserved after each event."""
    import torch

    sequences = []
    for seed in range(3):
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        gc.collect()
        rng = random.Random(seed)
        live: dict[int, object] = {}
        events = []
        base_alloc, base_reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
        for index in range(400):
            if live and rng.random() < 0.45:
                key = rng.choice(sorted(live))
                del live[key]
                events.append(
                    [
                        "f",
                        key,
                        torch.cuda.memory_allocated() - base_alloc,
                        torch.cuda.memory_reserved() - base_reserved,
                    ]
                )
            else:
                kind = rng.random()
                if kind < 0.4:
                    size = rng.randint(1, 1 << 20)
                elif kind < 0.8:
                    size = rng.randint(1 << 20, 12 << 20)
                else:
                    size = rng.randint(12 << 20, 200 << 20)
                live[index] = torch.empty(size, dtype=torch.uint8, device="cuda")
                events.append(
                    [
                        "a",
                        index,
                        size,
                        torch.cuda.memory_allocated() - base_alloc,
                        torch.cuda.memory_reserved() - base_reserved,
                    ]
                )
        live.clear()
        sequences.append(events)
    return sequences


# --- orchestration -----------------------------------------------------------------------


def _run_worker(args: list[str], env: dict, timeout: float) -> dict:
    started = time.perf_counter()
    try:
        proc = subprocess.run(
            [sys.executable, __file__, *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return {
            "error": f"timed out after {timeout:.0f}s",
            "seconds": time.perf_counter() - started,
        }
    if proc.returncode != 0:
        return {"error": proc.stderr[-3000:], "seconds": time.perf_counter() - started}
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["seconds"] = time.perf_counter() - started
    return result


def _gpu_name() -> str:
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "none"


def _gpu_key(name: str) -> str:
    from levers.hardware import gpu_from_device_name

    spec = gpu_from_device_name(name)
    return spec.name if spec is not None else "h100-80gb"


def _error(predicted: int, measured: int) -> float | None:
    if not measured:
        return None
    return round(100.0 * (predicted - measured) / measured, 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="")
    parser.add_argument("--calibrate", action="store_true")
    parser.add_argument("--only", default="")
    parser.add_argument(
        "--segments",
        action="store_true",
        help="also write the measured and modelled allocator segments (memory_segments.json)",
    )
    parser.add_argument("--jobs", type=int, default=4)
    parser.add_argument(
        "--gpu-gib", type=float, default=120.0, help="GPU memory to schedule within"
    )
    parser.add_argument("--commit", default=os.environ.get("LEVERS_COMMIT", "unknown"))
    parser.add_argument("--worker", choices=("predict", "measure", "probe", "fit", "fit-run"))
    parser.add_argument(
        "--fit-check",
        action="store_true",
        help="also check a --fit prediction on the GPU (see FIT_CHECK)",
    )
    parser.add_argument("--value", type=int, default=0)
    parser.add_argument("--cap-bytes", type=int, default=0)
    parser.add_argument("--name", default="")
    parser.add_argument("--gpu", default="h200")
    parser.add_argument(
        "--deadline-s",
        type=float,
        default=330.0,
        help="start no measurement after this many seconds; stop waiting then",
    )
    args = parser.parse_args()

    if args.worker == "predict":
        print(json.dumps(predict_worker(args.name, args.gpu, args.segments)))
        return
    if args.worker == "measure":
        print(json.dumps(measure_worker(args.name, args.calibrate, args.segments)))
        return
    if args.worker == "probe":
        print(json.dumps(probe_worker()))
        return
    if args.worker == "fit":
        print(json.dumps(fit_worker()))
        return
    if args.worker == "fit-run":
        print(json.dumps(fit_run_worker(args.value, args.cap_bytes)))
        return

    import torch

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    names = [n for n, *_ in CONFIGS if not args.only or n in args.only.split(",")]
    gpu_name = _gpu_name()
    gpu = _gpu_key(gpu_name)
    env_cpu = {
        **os.environ,
        "CUDA_VISIBLE_DEVICES": "",
        "PYTHONPATH": str(ROOT / "src"),
        "OMP_NUM_THREADS": "1",
    }
    env_gpu = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    started = time.perf_counter()

    predictions: dict[str, dict] = {}
    measurements: dict[str, dict] = {}
    probe: dict = {}
    deadline = started + args.deadline_s
    cpu_pool = futures.ThreadPoolExecutor(max_workers=6)
    gpu_pool = futures.ThreadPoolExecutor(max_workers=args.jobs + 1)
    predicted = {
        cpu_pool.submit(
            _run_worker,
            ["--worker", "predict", "--name", n, "--gpu", gpu]
            + (["--segments"] if args.segments else []),
            env_cpu,
            args.deadline_s + 30,
        ): n
        for n in names
    }
    fit_future = None
    if args.fit_check:
        fit_future = cpu_pool.submit(
            _run_worker, ["--worker", "fit"], env_cpu, args.deadline_s + 30
        )
    probe_future = None
    if args.calibrate:
        probe_future = gpu_pool.submit(_run_worker, ["--worker", "probe"], env_gpu, args.deadline_s)
    measurements = _measure_all(gpu_pool, names, args, env_gpu, deadline)
    done, _ = futures.wait(list(predicted), timeout=max(deadline + 40 - time.perf_counter(), 1))
    for future in done:
        predictions[predicted[future]] = future.result()
    if probe_future is not None:
        futures.wait([probe_future], timeout=max(deadline + 40 - time.perf_counter(), 1))
        if probe_future.done():
            probe = probe_future.result()
    fit_check = {}
    if fit_future is not None:
        futures.wait([fit_future], timeout=max(deadline + 40 - time.perf_counter(), 1))
        predicted = fit_future.result() if fit_future.done() else {"error": "not finished"}
        # after the accuracy runs, one at a time: the GPU's memory must be this run's alone,
        # or a run can fail for want of physical memory rather than of budget
        fit_check = _fit_runs(predicted, env_gpu, args.deadline_s + 30)
        (out / "memory_fit_check.json").write_text(json.dumps(fit_check, indent=1))
        print("fit check:", json.dumps(fit_check)[:2000], flush=True)
    cpu_pool.shutdown(wait=False, cancel_futures=True)
    gpu_pool.shutdown(wait=False, cancel_futures=True)

    rows = []
    oplogs = {}
    segments = {}
    for name in names:
        spec, params, _ = _config(name)
        p, m = predictions.get(name, {}), measurements.get(name, {})
        if "oplog" in m:
            oplogs[name] = m.pop("oplog")
        if "segments" in m or "segments" in p:
            segments[name] = {
                "measured": m.pop("segments", None),
                "predicted": p.pop("segments", None),
            }
            print(_segments_line(name, segments[name]), flush=True)
        row = {
            "commit": args.commit,
            "torch": torch.__version__,
            "gpu": gpu_name,
            "gpu_key": gpu,
            "config": name,
            "workload": spec,
            "params": params,
            "num_steps": NUM_STEPS,
            "predicted_allocated_bytes": p.get("predicted_allocated_bytes"),
            "measured_allocated_bytes": m.get("measured_allocated_bytes"),
            "predicted_reserved_bytes": p.get("predicted_reserved_bytes"),
            "measured_reserved_bytes": m.get("measured_reserved_bytes"),
        }
        if row["predicted_allocated_bytes"] is not None and row["measured_allocated_bytes"]:
            row["allocated_error_pct"] = _error(
                row["predicted_allocated_bytes"], row["measured_allocated_bytes"]
            )
            row["reserved_error_pct"] = _error(
                row["predicted_reserved_bytes"], row["measured_reserved_bytes"]
            )
        row["prediction"] = p
        row["measurement"] = m
        rows.append(row)
        print(
            f"{name:28s} alloc pred {_gib(row['predicted_allocated_bytes'])} meas "
            f"{_gib(row['measured_allocated_bytes'])} ({row.get('allocated_error_pct')}%)  reserved pred "
            f"{_gib(row['predicted_reserved_bytes'])} meas {_gib(row['measured_reserved_bytes'])} "
            f"({row.get('reserved_error_pct')}%)",
            flush=True,
        )
    report = {"command": " ".join(sys.argv), "seconds": time.perf_counter() - started, "rows": rows}
    (out / "memory_accuracy.json").write_text(json.dumps(report, indent=1, default=str))
    _write_csv(out / "memory_accuracy.csv", rows)
    if args.segments:
        (out / "memory_segments.json").write_text(json.dumps(segments, default=str))
    if args.calibrate:
        (out / "memory_calibration.json").write_text(json.dumps(probe, default=str))
        with gzip.open(out / "memory_oplogs.json.gz", "wt") as handle:
            json.dump(oplogs, handle)
    print(f"done in {time.perf_counter() - started:.0f}s", flush=True)


def _measure_all(pool, names: list[str], args, env: dict, deadline: float) -> dict[str, dict]:
    """Run the measurements, several at once, keeping their GPU memory within --gpu-gib."""
    pending = sorted(names, key=lambda n: -_config(n)[2])
    running: dict = {}
    results: dict[str, dict] = {}
    extra = (["--calibrate"] if args.calibrate else []) + (["--segments"] if args.segments else [])
    while pending or running:
        if time.perf_counter() > deadline:
            for name in pending:
                results[name] = {"error": "not started: past the deadline"}
            pending = []
            if not running:
                break
        in_use = sum(_config(n)[2] for n in running.values())
        launched = False
        for name in list(pending):
            need = _config(name)[2]
            if len(running) < args.jobs and (in_use + need <= args.gpu_gib or not running):
                timeout = max(deadline + 60 - time.perf_counter(), 30)
                future = pool.submit(
                    _run_worker, ["--worker", "measure", "--name", name, *extra], env, timeout
                )
                running[future] = name
                pending.remove(name)
                in_use += need
                launched = True
        if running and (not launched or not pending):
            done, _ = futures.wait(list(running), return_when=futures.FIRST_COMPLETED)
            for future in done:
                results[running.pop(future)] = future.result()
    return results


def _fit_runs(predicted: dict, env_gpu: dict, timeout: float) -> dict:
    """Run the predicted best value and the next one on the GPU, capped at the budget and not."""
    if predicted.get("best") is None:
        return {"prediction": predicted}
    best, budget = predicted["best"], predicted["budget_bytes"]
    runs = [
        _run_worker(
            ["--worker", "fit-run", "--value", str(value), "--cap-bytes", str(cap)],
            env_gpu,
            timeout,
        )
        for value in (best, best + 1)
        for cap in (budget, 0)
    ]
    return {"prediction": predicted, "runs": runs}


def _segments_line(name: str, segments: dict) -> str:
    """Segment bytes by size class, measured vs modelled: where the reserved gap sits."""

    def classes(sizes: list[int]) -> str:
        bins = {"2MiB": 0, "20MiB": 0, "other<=100MiB": 0, ">100MiB": 0}
        for size in sizes:
            key = (
                "2MiB" if size == 2 << 20 else "20MiB" if size == 20 << 20
                else "other<=100MiB" if size <= 100 << 20 else ">100MiB"
            )  # fmt: skip
            bins[key] += size
        return " ".join(f"{k} {v / GIB:.3f}" for k, v in bins.items())

    measured = [row[1] for row in (segments.get("measured") or {}).get("held", [])]
    predicted = [row[0] for row in segments.get("predicted") or []]
    return (
        f"{name:28s} segments GiB measured [{classes(measured)}] ({len(measured)}) "
        f"predicted [{classes(predicted)}] ({len(predicted)})"
    )


def _gib(value) -> str:
    return "-" if value is None else f"{value / GIB:7.3f}"


def _write_csv(path: Path, rows: list[dict]) -> None:
    fields = [
        "commit",
        "torch",
        "gpu",
        "config",
        "predicted_allocated_bytes",
        "measured_allocated_bytes",
        "allocated_error_pct",
        "predicted_reserved_bytes",
        "measured_reserved_bytes",
        "reserved_error_pct",
    ]
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    try:
        main()
    except Exception:
        traceback.print_exc()
        raise
