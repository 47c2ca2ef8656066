"""ATTN002's freed memory against an A/B of the fix, on a GPU.

For each case, three fresh processes, one after the other (the GPU holds one at a time):

- ``levers audit`` of the eager workload on the GPU (``--findings-json``): what ATTN002 says
  the switch to ``F.scaled_dot_product_attention`` frees at the peak, and how that figure was
  obtained (predicted by levers memory, or the score-shape estimate);
- the eager workload, and the same workload with SDPA: ``NUM_STEPS`` steps each, then
  ``torch.cuda.max_memory_allocated()`` and ``max_memory_reserved()``.

The measured drop is the eager peak minus the SDPA peak. One row per case (commit, torch, GPU,
shapes, claimed, measured, their ratio) to ``OUT/attn_freed.json`` and a table to
``OUT/attn_freed.md``.

Cases:
    qwen2-1b-eager     the ``hf`` workload, arch=qwen2 size=1b (batch 4, seq 2048), eager vs sdpa
    llama-1b-eager     the same with arch=llama
    vit-b16-timm-eager timm vit_base_patch16_224, batch 64, fused_attn off vs on
                       (bench/vision_workloads.py)

Usage (GPU machine, repository root):
    python bench/attn_freed.py --out OUT [--only NAME,...]
    LEVERS_BENCH_DEVICE=cpu python bench/attn_freed.py --out OUT --only smoke-vit-tiny-eager
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

NUM_STEPS = 3
GIB = 1 << 30
VISION = str(ROOT / "bench" / "vision_workloads.py")

# name: (spec, eager params, what the fix changes)
CASES = {
    "qwen2-1b-eager": ("hf", {"arch": "qwen2", "attn": "eager", "size": "1b"}, {"attn": "sdpa"}),
    "llama-1b-eager": ("hf", {"arch": "llama", "attn": "eager", "size": "1b"}, {"attn": "sdpa"}),
    "vit-b16-timm-eager": (
        VISION + ":vit",
        {"impl": "timm", "batch_size": 64, "fused_attn": "false"},
        {"fused_attn": "true"},
    ),
    # a CPU check that the script runs (not a result)
    "smoke-vit-tiny-eager": (
        VISION + ":vit",
        {"impl": "standin", "size": "tiny", "batch_size": 2, "fused_attn": "false"},
        {"fused_attn": "true"},
    ),
}
DEVICE = os.environ.get("LEVERS_BENCH_DEVICE", "cuda")


def measure_worker(name: str, side: str) -> dict:
    import torch

    from levers.loader import load_workload

    spec, params, fix = CASES[name]
    params = {**params, **(fix if side == "fixed" else {}), "device": DEVICE}
    workload = load_workload(spec, params)
    for _ in range(NUM_STEPS):
        workload.step()
    if DEVICE != "cuda":
        return {"params": params}
    torch.cuda.synchronize()
    return {
        "params": params,
        "peak_allocated_bytes": torch.cuda.max_memory_allocated(),
        "peak_reserved_bytes": torch.cuda.max_memory_reserved(),
    }


def audit_worker(name: str) -> dict:
    spec, params, _ = CASES[name]
    sets = [f"{k}={v}" for k, v in {**params, "device": DEVICE}.items()]
    with tempfile.TemporaryDirectory() as tmp:
        findings_path = os.path.join(tmp, "findings.json")
        command = [sys.executable, "-m", "levers", "audit", spec, "--set", *sets,
                   "--findings-json", findings_path, "--select", "ATTN002"]
        done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT,
                              env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
        if not os.path.exists(findings_path):
            return {"error": (done.stderr or done.stdout)[-2000:], "returncode": done.returncode}
        report = json.load(open(findings_path))
    found = [f for f in report["findings"] if f["code"] == "ATTN002"]
    return {
        "returncode": done.returncode,
        "claimed_freed_bytes": sum(f["cost"].get("saved_bytes") or 0 for f in found),
        "sources": [f["details"].get("freed_bytes_source") for f in found],
        "messages": [f["message"] for f in found],
        "stderr_tail": done.stderr[-1500:],
    }


def _run(args: list[str], timeout: float) -> dict:
    done = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    if done.returncode != 0:
        return {"error": done.stderr[-2000:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="")
    parser.add_argument("--only", default="")
    parser.add_argument("--worker", choices=("audit", "measure"))
    parser.add_argument("--name", default="")
    parser.add_argument("--side", default="eager", choices=("eager", "fixed"))
    parser.add_argument("--timeout-s", type=float, default=240.0)
    args = parser.parse_args()
    if args.worker == "audit":
        print(json.dumps(audit_worker(args.name)))
        return 0
    if args.worker == "measure":
        print(json.dumps(measure_worker(args.name, args.side)))
        return 0

    import torch

    from levers.environment import levers_commit_id
    from levers.output.atomic import atomic_write_text

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    names = [n for n in CASES
             if (n in args.only.split(",") if args.only else not n.startswith("smoke"))]
    rows = []
    for name in names:
        t0 = time.perf_counter()
        audit = _run(["--worker", "audit", "--name", name], args.timeout_s)
        eager = _run(["--worker", "measure", "--name", name, "--side", "eager"], args.timeout_s)
        fixed = _run(["--worker", "measure", "--name", name, "--side", "fixed"], args.timeout_s)
        row = {"case": name, "audit": audit, "eager": eager, "fixed": fixed}
        if "peak_allocated_bytes" in eager and "peak_allocated_bytes" in fixed:
            row["measured_freed_bytes"] = (
                eager["peak_allocated_bytes"] - fixed["peak_allocated_bytes"]
            )
            claimed = audit.get("claimed_freed_bytes")
            if claimed:
                row["claimed_over_measured"] = claimed / row["measured_freed_bytes"]
        rows.append(row)
        print(f"{name:22s} claimed {_gib(audit.get('claimed_freed_bytes'))} "
              f"({', '.join(map(str, audit.get('sources', [])))}) measured "
              f"{_gib(row.get('measured_freed_bytes'))} ratio "
              f"{row.get('claimed_over_measured', float('nan')):.3f} "
              f"[{time.perf_counter() - t0:.0f} s]", flush=True)
        for side in ("audit", "eager", "fixed"):
            if "error" in row[side]:
                print(f"  {side}: {row[side]['error'][-600:]}", flush=True)
    report = {
        "command": " ".join(sys.argv),
        "commit": os.environ.get("LEVERS_COMMIT") or levers_commit_id(),
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "num_steps": NUM_STEPS,
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "rows": rows,
    }
    atomic_write_text(out / "attn_freed.json", json.dumps(report, indent=1))
    lines = [
        "| case | ATTN002 claims freed | how | measured (eager - sdpa peak allocated) | claimed / measured |",
        "| --- | ---: | --- | ---: | ---: |",
    ]
    for row in rows:
        lines.append(
            f"| {row['case']} | {_gib(row['audit'].get('claimed_freed_bytes'))} | "
            f"{', '.join(map(str, row['audit'].get('sources', [])))} | "
            f"{_gib(row.get('measured_freed_bytes'))} | "
            f"{row.get('claimed_over_measured', float('nan')):.3f} |"
        )
    atomic_write_text(out / "attn_freed.md", "\n".join(lines) + "\n")
    return 0


def _gib(value) -> str:
    return "-" if value is None else f"{value / GIB:.2f} GiB"


if __name__ == "__main__":
    sys.exit(main())
