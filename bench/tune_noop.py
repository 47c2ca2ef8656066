"""Benchmark: how often ``levers tune demo`` on a CPU keeps a lever that does nothing.

    PYTHONPATH=src python bench/tune_noop.py --runs 20 --budget 60s --lever tune-noop,ac-full \
        --out bench/results/tune_noop_cpu

Issue 33's goal: a planted no-op lever is kept in at most 1 of 20 CPU tune runs. Each run is
``levers tune demo --seed I --no-audit --budget B --lever L`` in a process of its own (started as
a user's is), with one more lever registered in that process only: ``tune-noop``, an exact
lever that applies to every model and whose patch changes nothing (its undo undoes nothing). Its
A/Bs are A/As in all but the name, so each run that keeps it kept noise. The runs are seeded
``--seed 0 .. runs-1`` (the workloads' seed and the bootstrap's), and ``--load N`` runs N busy
processes beside them (the loaded machine of the defect: the shared machine is loaded already,
so the default is none). The no-op has no expected saving, so the search tries it after the
levers with one above 1: with ``--lever tune-noop,ac-full`` (ac-full is expected slower) it is the
first A/B of every run, which a short budget always holds; with levers expected to pay before it
(inplace-scatter, loss-valid-rows), a loaded 2-core machine spent a 60 s budget before reaching it
in 3 of 7 runs.

Per run the row says whether the no-op was tried, whether its selection A/B paid (what the
search before confirmations would have kept: it proved a lever of one by the A/B that selected
it), whether it was kept, the stack, the A/Bs, the wall time and the 1-minute load average at the
end. Writes ``OUT/rows.jsonl`` (one row per run, with the commit, torch, CPU and the command),
``OUT/record.jsonl`` (every run's tune record: each A/B and each result) and ``OUT/README.md``
(the command, the commit, torch, the counts).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
NOOP = "tune-noop"


def _register_noop() -> None:
    """Register ``tune-noop`` in this process: exact, applies everywhere, changes nothing."""
    from levers.levers import register
    from levers.levers.lever import Lever
    from levers.vocab import EXACT

    def patch(_target: Any):
        return lambda: None

    register(Lever(
        id=NOOP, title="Change nothing (a planted no-op, bench/tune_noop.py)", safety=EXACT,
        fixes=(), applies=lambda _target: None, patch=patch,
    ))


def _child(argv: list[str]) -> int:
    """``levers tune ARGV`` with the no-op registered (one run)."""
    _register_noop()
    from levers.cli import main

    return main(argv)


def _tune_argv(args: argparse.Namespace, seed: int, json_path: Path, record: Path) -> list[str]:
    return ["tune", "demo", "--seed", str(seed), "--budget", args.budget, "--lever", args.lever,
            "--no-audit", "--record", str(record), "--json", str(json_path)]


def _row(result: dict[str, Any], seed: int, rc: int, wall_s: float) -> dict[str, Any]:
    outcome = next((o for o in result["outcomes"] if o["lever"] == NOOP), None)
    trials = result["trials"]
    selections = [t for t in trials if t["stack"][-1:] == [NOOP] and t["role"] == "selection"]
    return {
        "seed": seed,
        "rc": rc,
        "wall_s": round(wall_s, 1),
        "stack": result["stack"],
        "noop_tried": bool(selections),
        "noop_selection_paid": any(t["pays"] for t in selections),
        "noop_kept": NOOP in result["stack"],
        "noop_reason": outcome["reason"] if outcome else None,
        "noop_tokens_per_s_ci95": selections[0]["tokens_per_s_ci95"] if selections else None,
        "num_ab": len(trials),
        "spent_s": round(result["spent_s"], 1),
        "interrupted": result.get("interrupted"),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }


def _busy() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "while True:\n    pass"])


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        sys.path.insert(0, str(ROOT / "src"))
        return _child(sys.argv[2:])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--budget", default="60s")
    parser.add_argument("--lever", default=f"{NOOP},ac-full")
    parser.add_argument("--load", type=int, default=0, help="busy processes beside the runs")
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/tune_noop_cpu")
    args = parser.parse_args()

    sys.path.insert(0, str(ROOT / "src"))
    import torch

    from levers.environment import cpu_name, levers_commit_id

    args.out.mkdir(parents=True, exist_ok=True)
    command = "PYTHONPATH=src python bench/tune_noop.py " + shlex.join(sys.argv[1:])
    head = {"commit": levers_commit_id(), "torch": torch.__version__, "cpu": cpu_name(),
            "cores": os.cpu_count(), "budget": args.budget, "levers": args.lever,
            "load": args.load, "command": command}
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), env.get("PYTHONPATH")) if p)
    busy = [_busy() for _ in range(args.load)]
    rows = []
    started = time.monotonic()
    try:
        for seed in range(args.runs):
            json_path = args.out / f".run-{seed}.json"
            argv = _tune_argv(args, seed, json_path, args.out / "record.jsonl")
            before = time.monotonic()
            done = subprocess.run([sys.executable, __file__, "--child", *argv], env=env,
                                  capture_output=True, text=True)
            wall_s = time.monotonic() - before
            if not json_path.is_file():
                raise SystemExit(f"run {seed} gave rc {done.returncode} and no result:\n"
                                 f"{done.stdout}\n{done.stderr}")
            row = {**_row(json.loads(json_path.read_text()), seed, done.returncode, wall_s),
                   **head}
            json_path.unlink()
            rows.append(row)
            with open(args.out / "rows.jsonl", "a") as out:
                out.write(json.dumps(row) + "\n")
            print(f"run {seed}: stack {','.join(row['stack']) or '-'}; no-op tried "
                  f"{row['noop_tried']}, its selection paid {row['noop_selection_paid']}, kept "
                  f"{row['noop_kept']} ({wall_s:.0f} s, load {row['load_avg_1m']})", flush=True)
    finally:
        for proc in busy:
            proc.kill()
            proc.wait()
    _readme(args.out, head, rows, time.monotonic() - started)
    return 0


def _readme(out: Path, head: dict[str, Any], rows: list[dict[str, Any]], total_s: float) -> None:
    def count(key: str) -> int:
        return sum(bool(r[key]) for r in rows)

    loads = [r["load_avg_1m"] for r in rows]
    cut = sum((r["noop_reason"] or "").startswith("the A/B was stopped") for r in rows)
    lines = [
        "# A planted no-op in `levers tune demo` on a CPU (bench/tune_noop.py)",
        "",
        "Made with:",
        "",
        "```",
        head["command"],
        "```",
        "",
        f"- levers commit {head['commit']}, torch {head['torch']}, {head['cpu']} "
        f"({head['cores']} cores, shared with other engineers' work; {head['load']} busy "
        f"process(es) added), 1-minute load average {min(loads):.2f} to {max(loads):.2f} at the "
        "ends of the runs",
        f"- {len(rows)} runs of `levers tune demo --seed I --no-audit --budget {head['budget']} "
        f"--lever {head['levers']}`, seeds 0 to {len(rows) - 1}, in {total_s / 60:.1f} min",
        "",
        f"**The no-op was kept in {count('noop_kept')} of {len(rows)} runs.** Its selection A/B "
        f"ran in {count('noop_tried')} ({cut} of them cut short by the budget) and paid in "
        f"{count('noop_selection_paid')}: the runs where the search before issue 33 would have "
        "kept it (it proved a stack of one lever by the A/B that selected it); now a fresh A/B "
        "of it must pay too.",
        "",
        "| seed | stack | no-op tried | its selection paid | kept | A/Bs | wall s | load |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r['seed']} | {','.join(r['stack']) or '-'} | {r['noop_tried']} | "
            f"{r['noop_selection_paid']} | {r['noop_kept']} | {r['num_ab']} | {r['wall_s']} | "
            f"{r['load_avg_1m']} |"
        )
    lines += ["", "`rows.jsonl` holds each run's row (the no-op's reason and CI95 too); "
              "`record.jsonl` every run's tune record (each A/B and each result).", ""]
    (out / "README.md").write_text("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
