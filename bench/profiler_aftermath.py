"""Does a step run slower after the profiler (or levers' capture) ran in the same process?

PyTorch's Kineto leaves CUPTI initialised after a profiling session unless ``TEARDOWN_CUPTI=1``
(pytorch/pytorch#144455: 10-20% slower training after profiling). levers' capture profiles one
step with CUDA activity, and ``levers audit --measure`` and ``levers tune`` then time steps in
the same process; a host-bound step would read slower there than in training, and a CUDA-graph
lever (few launches) would read more favourably than it is.

Each variant runs in a fresh subprocess: a zoo model's eager step timed (median of 20, a
synchronize around each step), then the profiler or levers' capture, then the same step timed
again. The variants: the profiler with CUDA activity, the same with ``TEARDOWN_CUPTI=1``,
levers' capture (``levers.Step(...).capture()``), the same with ``TEARDOWN_CUPTI=1``.

    PYTHONPATH=src python bench/profiler_aftermath.py --model vit --out $OUT/profiler_aftermath.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = {
    "profiler": {},
    "profiler-teardown": {"TEARDOWN_CUPTI": "1"},
    "levers-capture": {},
    "levers-capture-teardown": {"TEARDOWN_CUPTI": "1"},
}


def _steps(workload, n: int) -> dict:
    import torch

    durations = []
    for _ in range(n):
        torch.cuda.synchronize()
        begin = time.perf_counter()
        workload.step()
        torch.cuda.synchronize()
        durations.append(1e3 * (time.perf_counter() - begin))
    return {"median_ms": statistics.median(durations), "spread_ms": [min(durations), max(durations)]}


def child(variant: str, params: dict) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile

    import levers
    from levers.workloads import zoo

    workload = zoo.build(**params)
    _steps(workload, 5)
    before = _steps(workload, 20)
    started = time.perf_counter()
    if variant.startswith("profiler"):
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]):
            workload.step()
            torch.cuda.synchronize()
    else:
        levers.Step("zoo", params).capture()
    between_s = time.perf_counter() - started
    _steps(workload, 3)
    after = _steps(workload, 20)
    return {"variant": variant, "before": before, "after": after, "between_s": between_s,
            "ratio_after_before": after["median_ms"] / before["median_ms"],
            "env": {k: os.environ.get(k) for k in ("TEARDOWN_CUPTI", "DISABLE_CUPTI_LAZY_REINIT")}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="vit")
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    params = {"model": args.model, "size": "full", "device": "cuda", "layers": args.layers}
    if args.child:
        print("ROW " + json.dumps(child(args.child, params)), flush=True)
        return
    import torch

    sys.path.insert(0, str(ROOT / "src"))
    from levers.environment import levers_commit_id
    from levers.output.atomic import atomic_write_text

    rows = []
    for variant, env in VARIANTS.items():
        done = subprocess.run(
            [sys.executable, __file__, "--model", args.model, "--layers", str(args.layers),
             "--child", variant],
            env={**os.environ, **env}, capture_output=True, text=True, timeout=300,
        )
        found = [line[4:] for line in done.stdout.splitlines() if line.startswith("ROW ")]
        rows.append(json.loads(found[0]) if found else
                    {"variant": variant, "error": done.stderr.strip().splitlines()[-3:]})
        print(json.dumps(rows[-1]), flush=True)
    meta = {"commit": levers_commit_id(), "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name(), "params": params}
    atomic_write_text(args.out, json.dumps({"meta": meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
