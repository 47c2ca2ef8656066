"""Capture overhead: wall time of a captured step over a plain step.

For each workload: build it, run warm-up steps, then alternate plain and captured steps
(``capture_step(..., warmup=0, timed=0)`` records exactly one step) so drift hits both alike.
Writes one JSON row per workload with the commit, torch version, device, shape, the median and
spread (p10/p90) of each kind of step, and the overhead ratio of the medians.

Usage:
    python bench/capture_overhead.py --out bench/results/capture_overhead_cpu.jsonl \
        --case demo --case llama
    python bench/capture_overhead.py --out $OUT/capture_overhead_gpu.jsonl \
        --case "llama device=cuda size=1b"
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

from levers.capture import capture_step
from levers.capture.env import environment
from levers.loader import load_workload, parse_set


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # sync point: timing boundary


def _quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    pos = q * (len(xs) - 1)
    lo, hi = int(pos), min(int(pos) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _summary(xs: list[float]) -> dict[str, float]:
    return {
        "median_s": statistics.median(xs),
        "p10_s": _quantile(xs, 0.1),
        "p90_s": _quantile(xs, 0.9),
        "n": len(xs),
    }


def measure(case: str, *, warmup: int, repeats: int) -> dict:
    spec, *sets = case.split()
    params = parse_set(sets)
    workload = load_workload(spec, params)
    device = workload.device
    for _ in range(warmup):
        workload.step()
    plain_s: list[float] = []
    captured_s: list[float] = []  # capture_step end to end: the step plus assembling records
    step_only_s: list[float] = []  # the captured step alone, as the capture timed it
    num_ops = 0
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        workload.step()
        _sync(device)
        plain_s.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        capture = capture_step(workload, warmup=0, timed=0)
        captured_s.append(time.perf_counter() - t0)  # includes the kernel join on a GPU
        step_only_s.append(capture.timing.captured_step_s)
        num_ops = len(capture.ops)
    env = environment(device)
    plain, captured, step_only = _summary(plain_s), _summary(captured_s), _summary(step_only_s)
    return {
        "bench": "capture_overhead",
        "case": case,
        "workload": workload.name,
        "params": workload.params,
        "num_ops": num_ops,
        "tokens_per_step": workload.tokens_per_step,
        "plain": plain,
        "captured": captured,
        "captured_step_only": step_only,
        "overhead_ratio": captured["median_s"] / plain["median_s"],
        "step_only_overhead_ratio": step_only["median_s"] / plain["median_s"],
        "commit": env["levers_commit"],
        "torch": env["torch"],
        "device": env["device"],
        "device_name": env["device_name"],
        "num_cpus": env["num_cpus"],
        "load_average_1m": os.getloadavg()[0],  # other work on the machine skews CPU timings
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", action="append", required=True,
                        help='workload spec and --set items, e.g. "llama device=cuda size=1b"')
    parser.add_argument("--out", required=True, help="JSON-lines file to append rows to")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    for case in args.case:
        row = measure(case, warmup=args.warmup, repeats=args.repeats)
        with open(args.out, "a") as f:
            f.write(json.dumps(row) + "\n")
        print(
            f"{case:40s} ops={row['num_ops']:6d} plain={row['plain']['median_s'] * 1e3:9.2f} ms "
            f"captured={row['captured']['median_s'] * 1e3:9.2f} ms "
            f"overhead={row['overhead_ratio']:.2f}x "
            f"(captured step alone {row['step_only_overhead_ratio']:.2f}x)",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
