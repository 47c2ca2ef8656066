"""Benchmark probe: why compile-model's CUDA-graph form (``backend=cudagraphs``) pays what it pays
on a model, beside the eager step, in one process.

For each model and variant (``eager``, then each ``--stacks`` entry: levers joined by ``+``,
``channels-last+compile-model:backend=cudagraphs``) it builds the workload fresh,
runs warm-up and timed steps (synchronised, per-step wall times), then reads what dynamo did
(graphs, graph breaks, recompiles, CUDA-graph skips and their reasons) and profiles one more step:
its host wall time, the GPU's kernel time and the number of kernel launches outside a graph
replay. A launch-bound eager step shows wall >> kernel time; a replayed step that still launches
thousands of kernels was not captured.

    PYTHONPATH=src python bench/cudagraphs_probe.py --models arch@timm:inception_resnet_v2 \
        --out $OUT/cudagraphs_probe
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import levers  # noqa: E402
from levers.output.atomic import atomic_write_text  # noqa: E402
from levers_vs_peers import _sync  # noqa: E402
from tune_sweep import _environment, _free, model_params  # noqa: E402


def _counters() -> dict:
    from torch._dynamo.utils import counters

    return {group: dict(values) for group, values in counters.items()
            if group in ("stats", "graph_break", "inductor", "frames", "recompiles")}


def _profile(workload) -> dict:
    from torch.profiler import ProfilerActivity, profile

    device = workload.device
    _sync(device)
    begin = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        workload.step()
        _sync(device)
    wall_s = time.perf_counter() - begin
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    launches = [e for e in prof.events() if e.name in ("cudaLaunchKernel", "cuLaunchKernel",
                                                        "cudaLaunchKernelExC", "cuLaunchKernelEx")]
    replays = [e for e in prof.events() if e.name in ("cudaGraphLaunch",)]
    kernel_us = sum(e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
                    for e in kernels)
    return {"profiled_wall_s": wall_s, "gpu_kernels": len(kernels),
            "gpu_kernel_ms": kernel_us / 1e3, "kernel_launches": len(launches),
            "graph_launches": len(replays)}


def _step_times(workload, count: int) -> list[float]:
    """Wall seconds of ``count`` steps, each synchronised."""
    times = []
    for _ in range(count):
        begin = time.perf_counter()
        workload.step()
        _sync(workload.device)
        times.append(time.perf_counter() - begin)
    return times


def run(spec: str, params: dict, stack: list[str], warmup: int, steps: int) -> dict:
    row: dict = {"stack": stack}
    _free()  # dynamo reset with it
    from torch._dynamo.utils import counters
    counters.clear()
    try:
        torch.manual_seed(0)
        workload = levers.Step(spec, params=params).workload()
        row["tokens_per_step"] = workload.tokens_per_step
        # a CPU run checks the path: dynamo's eager backend, not a C++ compile
        options = {"backend": "eager"} if workload.device.type != "cuda" else {}
        handle = levers.apply(workload, stack, **options) if stack else None
        first = _step_times(workload, warmup)
        durations = _step_times(workload, steps)
        row.update(warmup_s=first, dur_s=durations, median_ms=1e3 * statistics.median(durations),
                   counters=_counters())
        row.update(_profile(workload))
        if handle is not None:
            handle.undo()
        row["status"] = "ok"
    except Exception as exc:  # noqa: BLE001 - a failing variant is a result
        row.update(status="failed", error=f"{type(exc).__name__}: {exc}"[:800])
        traceback.print_exc()
    _free()
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", required=True, help="SPEC@MODEL, comma-separated")
    parser.add_argument("--stacks", default="compile-model:backend=cudagraphs",
                        help="';'-separated stacks, each '+'-separated levers")
    parser.add_argument("--size", default="full")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    stacks = [[]] + [[x for x in s.split("+") if x] for s in args.stacks.split(";") if s]
    summary = {"environment": _environment(), "command": " ".join(sys.argv), "models": {}}
    for item in args.models.split(","):
        spec, model = item.split("@", 1)
        params = model_params(spec, model, args.size, args.device)
        rows = summary["models"].setdefault(item, {"params": params, "rows": []})["rows"]
        for stack in stacks:
            row = run(spec, params, stack, args.warmup, args.steps)
            rows.append(row)
            print(item, stack or "eager", row.get("status"), round(row.get("median_ms", 0), 2),
                  "ms", {k: row.get(k) for k in ("gpu_kernel_ms", "kernel_launches",
                                                 "graph_launches", "profiled_wall_s")},
                  flush=True)
            atomic_write_text(args.out / "summary.json", json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
