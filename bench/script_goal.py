"""Benchmark: ``levers tune -- python SCRIPT`` on an unchanged GPU training script against the
peers applied by hand in the same script (issue 33's script goal).

    PYTHONPATH=src python bench/script_goal.py --budget 5m --out $OUT/script_goal_h200
    PYTHONPATH=src python bench/script_goal.py --budget 60 --out /tmp/sg --script-args --batch-size 2 --seq-len 64

1. ``levers tune --budget B --json tune.json -- python bench/train_decoder.py --steps S``: the
   stack it proves on the script as it is, the time the whole command took.
2. The same script run once per row, timing its own steps (``--times``): the default, each peer
   as its users write it (``--peer compile-model``: ``model.compile()``; ``compile-layers``:
   ``layer.compile()`` per block; ``compile-model-ro`` where asked), and tune's stack
   (``--levers STACK``: ``levers.apply`` in the script). Each row's tokens/s is the median over
   its timed steps (its first 10 steps untimed); CI95 of a ratio by bootstrap over the steps.

Writes ``OUT/summary.json``: the rows, ``tune`` (stack, proof CI95, wall seconds), ``peers``
(ratio to the default), ``best_peer``, ``vs_best_peer`` (tune's stack over the best peer), with
the commit, torch version, GPU and date.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from levers.environment import levers_commit_id  # noqa: E402
from levers.output.atomic import atomic_write_text  # noqa: E402

SCRIPT = ROOT / "bench" / "train_decoder.py"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), env.get("PYTHONPATH")) if p)
    return env


def _bootstrap(a: list[float], b: list[float], rng: random.Random, n: int = 2000):
    """CI95 of median(a) / median(b), resampling each row's steps."""
    ratios = sorted(
        statistics.median(rng.choices(a, k=len(a))) / statistics.median(rng.choices(b, k=len(b)))
        for _ in range(n)
    )
    return ratios[int(0.025 * n)], ratios[int(0.975 * n) - 1]


def run_row(name: str, extra: list[str], args, out: Path) -> dict:
    times = out / f"{name}.times.json"
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--steps", str(args.row_steps), *args.script_args,
         "--times", str(times), *extra],
        capture_output=True, text=True, env=_env(), timeout=args.row_timeout_s,
    )
    row = {"row": name, "args": extra, "wall_s": time.perf_counter() - started,
           "returncode": done.returncode}
    if done.returncode != 0 or not times.is_file():
        row["error"] = done.stderr[-1500:]
        return row
    data = json.loads(times.read_text())
    tokens = data["tokens_per_step"]
    row["tokens_per_s_samples"] = [tokens / s for s in data["step_s"]]
    row["tokens_per_s"] = statistics.median(row["tokens_per_s_samples"])
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--budget", default="5m")
    parser.add_argument("--tune-steps", type=int, default=80,
                        help="the script's --steps in tune's runs (each needs 54 by default)")
    parser.add_argument("--row-steps", type=int, default=50)
    parser.add_argument("--peers", default="compile-model,compile-layers")
    parser.add_argument("--row-timeout-s", type=float, default=400)
    parser.add_argument("--script-args", nargs=argparse.REMAINDER, default=[])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    summary: dict = {
        "commit": levers_commit_id(), "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "date": datetime.date.today().isoformat(), "budget": args.budget,
        "script": ["python", "bench/train_decoder.py", "--steps", str(args.tune_steps),
                   *args.script_args],
    }
    tune_json = args.out / "tune.json"
    started = time.perf_counter()
    command = [sys.executable, "-m", "levers", "tune", "--budget", args.budget,
               "--json", str(tune_json), "--record", str(args.out / "tune.record.jsonl"), "--",
               "python", str(SCRIPT), "--steps", str(args.tune_steps), *args.script_args]
    done = subprocess.run(command, capture_output=True, text=True, env=_env())
    (args.out / "tune.log").write_text(done.stdout + "\n" + done.stderr)
    summary["tune"] = {"returncode": done.returncode, "wall_s": time.perf_counter() - started}
    stack: list[str] = []
    if tune_json.is_file():
        result = json.loads(tune_json.read_text())
        stack = list(result.get("stack") or [])
        proof = result.get("proof") or {}
        summary["tune"].update(stack=stack, proof_ci95=proof.get("tokens_per_s_ci95"),
                               proof_ratio=proof.get("tokens_per_s_ratio"),
                               trials=len(result.get("trials") or []))
    print(f"tune: {summary['tune']}", flush=True)
    rows = [run_row("default", [], args, args.out)]
    for peer in [p for p in args.peers.split(",") if p]:
        rows.append(run_row(peer, ["--peer", peer], args, args.out))
    if stack:
        rows.append(run_row("tuned", ["--levers", ",".join(stack)], args, args.out))
    for row in rows:
        print(f"  {row['row']}: {row.get('tokens_per_s') or row.get('error', '')[-300:]}",
              flush=True)
    ok = {r["row"]: r for r in rows if "tokens_per_s" in r}
    base = ok.get("default")
    if base is not None:
        ratio = lambda r: r["tokens_per_s"] / base["tokens_per_s"]  # noqa: E731
        summary["peers"] = {n: ratio(r) for n, r in ok.items() if n not in ("default", "tuned")}
        summary["best_peer"] = max(summary["peers"], key=summary["peers"].get, default=None)
        ours = ok.get("tuned")
        summary["tuned_ratio"] = ratio(ours) if ours else (1.0 if not stack else None)
        if ours:
            summary["tuned_ratio_ci95"] = _bootstrap(
                ours["tokens_per_s_samples"], base["tokens_per_s_samples"], rng)
        if summary["best_peer"] and summary["tuned_ratio"] is not None:
            summary["vs_best_peer"] = summary["tuned_ratio"] / summary["peers"][summary["best_peer"]]
    summary["rows"] = rows
    atomic_write_text(args.out / "summary.json", json.dumps(summary, indent=1) + "\n")
    print(json.dumps({k: summary.get(k) for k in ("tune", "peers", "best_peer", "tuned_ratio",
                                                   "vs_best_peer")}, default=str), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
