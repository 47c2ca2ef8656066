"""The audit's ranking on the ``hf`` llama with measured costs: what it puts first, and why.

Runs ``levers audit hf --set size=1b device=cuda`` (bf16 autocast, fused AdamW, batch 4, seq 2048)
on the GPU here and writes, under OUT:

- ``audit.md`` and ``audit.json``: the report as ``--md`` and ``--findings-json`` write it (the
  bottleneck by op class, the ranked findings, the recommended stack and its ``levers ab`` command);
- ``summary.json``: one object with the git commit, torch version, GPU name, workload parameters,
  the bound and free memory, the step by class (time, share, efficiency), and the ranking (code,
  lever ids, saved ms, freed bytes, payoff, recommended), for comparison with the levers measured
  one by one (the issue's table: per-layer compile 150.8 -> 99.8 ms, Liger 120.7 ms).

``--smoke`` runs the same on the CPU at ``size=tiny`` with ``--target h200`` (estimated costs), to
check the script without a GPU.

Usage:
    python bench/audit_ranking.py --out bench/results/audit_ranking_h200
    python bench/audit_ranking.py --smoke --out /tmp/audit_ranking_smoke
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="directory for the results")
    parser.add_argument("--smoke", action="store_true", help="CPU, size=tiny, --target h200")
    parser.add_argument("--size", default=None, help="hf size (default: 1b; tiny with --smoke)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    size = args.size or ("tiny" if args.smoke else "1b")
    device = "cpu" if args.smoke else "cuda"
    from levers.cli import main as levers_main

    md, js = args.out / "audit.md", args.out / "audit.json"
    cli = ["audit", "hf", "--set", f"size={size}", f"device={device}", "--md", str(md),
           "--findings-json", str(js)]
    if args.smoke:
        cli += ["--target", "h200", "--warmup", "0", "--timed", "1"]
    code = levers_main(cli)
    if not js.exists():
        print(f"the audit exited {code} without writing {js}", file=sys.stderr)
        return 1
    data = json.loads(js.read_text())
    summary = {
        "command": "levers " + " ".join(cli),
        "exit_code": code,
        "env": _env(),
        "step": {k: data["step"].get(k) for k in (
            "workload", "params", "device", "gpu_title", "step_s", "estimated_step_s",
            "tokens_per_step", "tokens_per_s", "mfu", "mfu_provenance", "peak_bytes")},
        "bottleneck": {
            k: data.get("bottleneck", {}).get(k)
            for k in ("bound", "bound_reason", "free_bytes", "step_ms", "provenance", "mfu",
                      "ceiling_mfu", "fixed_ms")
        },
        "classes": [
            {k: c[k] for k in ("name", "num_ops", "time_ms", "share", "ceiling_ms", "efficiency")}
            for c in data.get("bottleneck", {}).get("classes", [])
        ],
        "ranking": [
            {
                "rank": f["rank"], "code": f["code"], "levers": f["details"].get("levers")
                or [f["lever"]], "saved_ms": (f["cost"] or {}).get("saved_ms"),
                "saved_bytes": (f["cost"] or {}).get("saved_bytes"),
                "provenance": (f["cost"] or {}).get("provenance"), "payoff": f["payoff"],
                "recommended": f["details"].get("recommended", True), "severity": f["severity"],
            }
            for f in data["findings"]
        ],
        "recommendation": data.get("recommendation"),
    }
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"wrote {md}, {js} and {args.out / 'summary.json'}")
    return 0


def _env() -> dict:
    import torch

    from levers.environment import levers_commit_id

    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    return {"torch": torch.__version__, "gpu": gpu, "commit": levers_commit_id()}


if __name__ == "__main__":
    sys.exit(main())
