"""Benchmark: the figures the README and docs/memory.md quote for this machine's commands.

    PYTHONPATH=src python bench/docs_figures.py --repeats 3 --out bench/results/docs_figures_cpu

The docs quote how long a few commands take on the 2-core development CPU; this measures them
as a user runs them, each in a process of its own (imports included), so the docs can cite
figures with a source:

- ``levers audit`` (the demo, README's command 1 after its install): wall time per run;
- ``levers memory llama --set size=8b --gpu h100-80gb`` (docs/memory.md's example): wall time
  per run, and the prediction's own time (the plan's ``seconds``: build, steps on fake tensors,
  replay), the rest being imports, the what-ifs and printing;
- the number of tests ``pytest --collect-only -q`` collects (README's command 2; the tests are
  collected, not run).

Writes ``OUT/rows.jsonl`` (one row per run, with the commit, torch, CPU and the 1-minute load
average when it ended) and ``OUT/README.md`` (the command, the medians and ranges).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
AUDIT = ["audit"]
MEMORY = ["memory", "llama", "--set", "size=8b", "--gpu", "h100-80gb"]


def _levers(argv: list[str]) -> tuple[float, float]:
    """Run ``levers ARGV`` in a fresh process; its wall seconds and its CPU seconds (user and
    system: on a machine shared with other work, the wall time grows with their load, the CPU
    time much less)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "levers", *argv], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True,
    )
    wall_s = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"levers {shlex.join(argv)} exited {done.returncode}: {done.stderr}")
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall_s, cpu_s


def _collected() -> int:
    """How many tests ``pytest --collect-only -q`` collects."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q"], cwd=ROOT, env=env,
        capture_output=True, text=True,
    )
    last = [line for line in done.stdout.splitlines() if "collected" in line or "tests" in line]
    words = last[-1].split() if last else []
    if not words or not words[0].isdigit():
        raise SystemExit(f"pytest --collect-only said: {done.stdout[-500:]} {done.stderr[-500:]}")
    return int(words[0])


def _context() -> dict[str, Any]:
    import torch

    commit = subprocess.run(
        ["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    return {
        "commit": commit,
        "torch": torch.__version__,
        "cpu": _cpu_name(),
        "num_cpus": os.cpu_count(),
    }


def _cpu_name() -> str:
    """The CPU's model name (Linux's /proc/cpuinfo), else what platform says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    context = _context()
    rows = []
    for repeat in range(args.repeats):
        wall_s, cpu_s = _levers(AUDIT)
        rows.append({"what": "levers audit", "repeat": repeat, "wall_s": round(wall_s, 2),
                     "cpu_s": round(cpu_s, 2), "load_average_1m": os.getloadavg()[0], **context})
        with tempfile.TemporaryDirectory() as tmp:
            plan_json = Path(tmp) / "plan.json"
            wall_s, cpu_s = _levers([*MEMORY, "--json", str(plan_json)])
            seconds = json.loads(plan_json.read_text())["seconds"]
        rows.append({"what": "levers " + shlex.join(MEMORY), "repeat": repeat,
                     "wall_s": round(wall_s, 2), "cpu_s": round(cpu_s, 2),
                     "prediction_s": round(seconds, 2),
                     "load_average_1m": os.getloadavg()[0], **context})
    num_tests = _collected()
    rows.append({"what": "pytest --collect-only -q", "collected": num_tests,
                 "load_average_1m": os.getloadavg()[0], **context})
    with open(args.out / "rows.jsonl", "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    (args.out / "README.md").write_text(_readme(rows, args, context))
    print((args.out / "README.md").read_text())
    return 0


def _span(values: list[float]) -> str:
    return f"median {statistics.median(values):.1f} s (range {min(values):.1f} to {max(values):.1f} s)"


def _readme(rows: list[dict[str, Any]], args: argparse.Namespace, context: dict[str, Any]) -> str:
    audit = [r for r in rows if r["what"] == "levers audit"]
    memory = [r for r in rows if r["what"].startswith("levers memory")]
    loads = [r["load_average_1m"] for r in rows]
    collected = next(r["collected"] for r in rows if "collected" in r)
    command = (
        f"PYTHONPATH=src python bench/docs_figures.py --repeats {args.repeats} --out {args.out}"
    )
    return "\n".join([
        "# The figures the docs quote for the CPU development machine (bench/docs_figures.py)",
        "",
        "Made with:",
        "",
        "```",
        command,
        "```",
        "",
        f"- levers commit {context['commit']}, torch {context['torch']}, {context['cpu']} "
        f"({context['num_cpus']} cores, shared with other engineers' work), 1-minute load "
        f"average {min(loads):.2f} to {max(loads):.2f} when the runs ended",
        f"- each command in a process of its own, {args.repeats} times, imports included",
        "",
        f"- `levers audit` (the demo): wall {_span([r['wall_s'] for r in audit])}; CPU time "
        f"(user and system) {_span([r['cpu_s'] for r in audit])}",
        f"- `levers {shlex.join(MEMORY)}`: wall {_span([r['wall_s'] for r in memory])}; CPU time "
        f"{_span([r['cpu_s'] for r in memory])}; the prediction itself (the plan's `seconds`, "
        f"wall) {_span([r['prediction_s'] for r in memory])}",
        f"- `pytest --collect-only -q`: {collected:,} tests collected (collected, not run)",
        "",
    ])


if __name__ == "__main__":
    raise SystemExit(main())
