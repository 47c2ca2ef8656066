"""levers on two ranks: DDP and FSDP2 audits of the ``hf`` llama, and the per-rank memory
prediction against the measured peaks.

    python bench/distributed_audit.py OUT [--size 1b] [--nproc 2] [--smoke]

For each strategy (ddp, fsdp2) it runs, each in fresh processes:

1. ``torchrun --nproc_per_node=N -m levers audit bench/distributed_workloads.py:hf_parallel
   --set strategy=S size=SIZE --json OUT/audit_S.json --md OUT/audit_S.md`` (the merged report
   with measured communication, and rank 0's findings);
2. ``levers memory hf --set size=SIZE --world-size N --strategy S --json OUT/memory_S.json``
   with CUDA hidden (the CPU path a user without GPUs takes);
3. ``torchrun --nproc_per_node=N bench/distributed_memory_measure.py --strategy S`` (each rank's
   measured ``max_memory_allocated`` and ``max_memory_reserved`` after the same steps).

It writes ``OUT/distributed.json``: the git commit, torch version, GPU name, shapes, per
strategy the communication per rank (from the audit) and the predicted and measured per-rank
peaks with their errors in % (goal: allocated within 3 %, reserved within 5 %). ``--smoke``
runs the same at size=tiny on the CPU with gloo (no measured peaks: a CPU has no allocator).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
STRATEGIES = ("ddp", "fsdp2")
MEMORY_STEPS = 3


def _run(cmd: list[str], env: dict[str, str], log: Path) -> int:
    started = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    log.write_text(
        f"$ {' '.join(cmd)}\n# exit {proc.returncode} after {time.perf_counter() - started:.1f} s\n"
        f"## stdout\n{proc.stdout}\n## stderr\n{proc.stderr}\n"
    )
    return proc.returncode


def _error_pct(predicted: int | None, measured: int | None) -> float | None:
    if predicted is None or not measured:
        return None
    return 100.0 * (predicted - measured) / measured


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--size", default="1b")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--smoke", action="store_true", help="size=tiny on the CPU with gloo")
    args = parser.parse_args()
    size, device = ("tiny", "cpu") if args.smoke else (args.size, "cuda")
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    workloads = str(ROOT / "bench" / "distributed_workloads.py")
    import torch

    summary: dict = {
        "git_commit": subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip(),
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "num_gpus": torch.cuda.device_count(),
        "size": size,
        "nproc": args.nproc,
        "memory_steps": MEMORY_STEPS,
        "strategies": {},
    }
    for strategy in STRATEGIES:
        row: dict = {}
        audit_json = out / f"audit_{strategy}.json"
        row["audit_exit"] = _run(
            [TORCHRUN, "--standalone", f"--nproc_per_node={args.nproc}", "-m", "levers", "audit",
             f"{workloads}:hf_parallel", "--set", f"strategy={strategy}", f"size={size}",
             f"device={device}", "--json", str(audit_json), "--md", str(out / f"audit_{strategy}.md")],
            env, out / f"audit_{strategy}.log",
        )
        if audit_json.exists():
            merged = json.loads(audit_json.read_text())["distributed"]
            row["ranks"] = [
                {k: r[k] for k in ("rank", "median_step_s", "compute_us", "comm_us", "idle_us",
                                   "timing_source", "collectives")}
                for r in merged["ranks"]
            ]
            row["straggler"] = merged["straggler"]
        memory_json = out / f"memory_{strategy}.json"
        row["memory_exit"] = _run(
            [sys.executable, "-m", "levers", "memory", "hf", "--set", f"size={size}",
             "--no-whatifs", "--steps", str(MEMORY_STEPS), "--world-size", str(args.nproc),
             "--strategy", strategy, "--json", str(memory_json)],
            {**env, "CUDA_VISIBLE_DEVICES": ""}, out / f"memory_{strategy}.log",
        )
        predicted = (
            json.loads(memory_json.read_text())["extra"]["per_rank"] if memory_json.exists() else None
        )
        measured_dir = out / f"measured_{strategy}"
        row["measure_exit"] = _run(
            [TORCHRUN, "--standalone", f"--nproc_per_node={args.nproc}",
             str(ROOT / "bench" / "distributed_memory_measure.py"), "--strategy", strategy,
             "--size", size, "--device", device, "--steps", str(MEMORY_STEPS), "--out",
             str(measured_dir)],
            env, out / f"measured_{strategy}.log",
        )
        measured = [
            json.loads(p.read_text()) for p in sorted(measured_dir.glob("rank*.json"))
        ]
        row["predicted"] = predicted
        row["measured"] = measured
        if predicted is not None:
            row["errors_pct"] = [
                {
                    "rank": m["rank"],
                    "allocated": _error_pct(predicted["peak_allocated_bytes"], m["peak_allocated_bytes"]),
                    "reserved": _error_pct(predicted["peak_reserved_bytes"], m["peak_reserved_bytes"]),
                }
                for m in measured
            ]
        summary["strategies"][strategy] = row
    (out / "distributed.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps({s: {k: v for k, v in r.items() if k.endswith(("exit", "errors_pct"))}
                      for s, r in summary["strategies"].items()}, indent=1))
    bad = [s for s, r in summary["strategies"].items()
           if r["audit_exit"] or r["memory_exit"] or r["measure_exit"]]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
