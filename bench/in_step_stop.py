"""Benchmark probe: ab's kill line inside a step, on a first step that compiles for minutes.

One process, two A/Bs of tune's measurement (``levers.tune.measure.ab_measure``) on timm's
inception_resnet_v2: whole-model inductor compile given a kill line shorter than its cold compile
(it must stop at the line, inside its first candidate step), then a compile of the same model
with another backend (it must compile and run as usual after the stop's dynamo reset).
Run with inductor's caches off, so the compile is cold:

    TORCHINDUCTOR_FX_GRAPH_CACHE=0 TORCHINDUCTOR_AUTOGRAD_CACHE=0 LEVERS_TORCHVISION_WITHOUT_OPS=1 \\
        PYTHONPATH=src python bench/in_step_stop.py --out bench/results/in_step_stop_cpu

Writes ``OUT/result.json``: each A/B's wall time, decision, kill reason and phases, with the
environment.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import time
from pathlib import Path

import torch

from levers.output.atomic import atomic_write_text
from levers.tune.measure import TrialDesign, ab_measure


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="timm:inception_resnet_v2")
    parser.add_argument("--size", default="tiny")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--kill-s", type=float, default=40.0)
    parser.add_argument("--then", default="compile-model:backend=aot_eager",
                        help="the A/B run after the stopped one, in the same process")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    measure = ab_measure("arch", {"model": args.model, "size": args.size, "device": args.device},
                         TrialDesign(steps=5, warmup=1))
    runs = []
    for stack, kill_s in ((("compile-model",), args.kill_s), ((args.then,), 600.0)):
        started = time.perf_counter()
        trial = measure((), stack, kill_s)
        runs.append({
            "stack": list(stack), "kill_line_s": kill_s,
            "wall_s": round(time.perf_counter() - started, 1), "decision": trial.decision,
            "parity": trial.parity, "killed": trial.killed, "error": trial.error,
            "phase_s": trial.phase_s,
        })
        print(json.dumps(runs[-1]), flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out / "result.json", json.dumps({
        "model": args.model, "size": args.size, "device": args.device, "runs": runs,
        "torch": torch.__version__, "commit": commit, "machine": platform.processor() or
        platform.machine(), "cpus": __import__("os").cpu_count(),
    }, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
