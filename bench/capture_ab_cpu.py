"""Capture host cost per op on the CPU, this levers against an older one, paired in one process.

On a shared machine the CPU time of a captured step swings by tens of percent from one process
to the next, more than most changes to the recorder are worth. This script imports both
levers (the older one copied under the package name ``levers_before``, see ``--make-before``)
and, per repeat, runs a plain step, a step under an empty ``TorchDispatchMode`` and
``TorchFunctionMode`` (the floor of any Python dispatch mode; no levers code), and one
``capture_step`` of each levers, in alternating order, on the same workload object. Times are
the thread's CPU time (one torch thread). Per op: (captured step - plain step) / number of ops,
for the step alone (``before``/``after``, what the issue calls the per-op host cost) and for
``capture_step`` end to end (``*_e2e``: records assembled too). The two must record the same
number of ops.

``--modes`` pairs this levers' two capture modes instead of two levers: "before" is the
one-pass capture (the step recorded and timed under the op recorder), "after" the two-pass one,
whose timed step is the second step ``capture_step`` runs (under the profiler alone; the
figures of "after" are that step's) and whose end-to-end figure covers both steps and the join.

One JSON row per workload to ``OUT_DIR/capture_ab_cpu.jsonl``: commit, torch, CPU, op count,
median, p10, p90 and min-based per-op figures, the paired ratio after/before and the 1-minute
load average.

Usage:
    python bench/capture_ab_cpu.py --make-before REV --before-dir DIR   # once: REV's levers
    PYTHONPATH=src:DIR python bench/capture_ab_cpu.py --out OUT_DIR --repeats 31 \\
        --case demo --case llama --case "hf arch=llama attn=sdpa size=tiny" \\
        --shape gpt2-medium8 --shape vit-b16
    PYTHONPATH=src python bench/capture_ab_cpu.py --modes --out OUT_DIR --repeats 31 --case demo
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from levers.environment import environment
from levers.output.atomic import atomic_write_text


def make_before(rev: str, directory: str) -> None:
    """Copy ``src/levers`` at git revision ``rev`` to ``directory/levers_before``, renamed."""
    target = Path(directory)
    target.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "archive", rev, "src/levers"], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
    package = target / "levers_before"
    (target / "src" / "levers").rename(package)
    (target / "src").rmdir()
    for path in package.rglob("*.py"):
        text = path.read_text()
        text = re.sub(r"\bfrom levers([. ])", r"from levers_before\1", text)
        text = re.sub(r"\bimport levers\b", "import levers_before", text)
        text = re.sub(r"\blevers\.(__file__|__version__)", r"levers_before.\1", text)
        text = text.replace('"levers.', '"levers_before.')
        path.write_text(text)


class _EmptyDispatch(TorchDispatchMode):
    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


class _EmptyFunction(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def _quantile(xs: list[float], q: float) -> float:
    return sorted(xs)[round(q * (len(xs) - 1))]


def measure(name: str, workload: Any, repeats: int, modes: bool) -> dict[str, Any]:
    from levers.capture import capture_step as after

    if modes:
        captures: dict[str, Callable[..., Any]] = {
            "before": functools.partial(after, mode="one-pass"),
            "after": functools.partial(after, mode="two-pass"),
        }
    else:
        from levers_before.capture import capture_step as before

        captures = {"before": before, "after": after}
    for _ in range(2):
        workload.step()
    for capture in captures.values():  # fills each levers' caches
        capture(workload, warmup=0, timed=0, ran_before=True)
    step = workload.step
    step_cpu_s = [0.0]
    step_wall_s = [0.0]

    def timed_step() -> Any:  # the step as capture_step calls it (its last call: the timed one)
        c0, t0 = time.thread_time(), time.perf_counter()
        try:
            return step()
        finally:
            step_cpu_s[0] = time.thread_time() - c0
            step_wall_s[0] = time.perf_counter() - t0

    labels = ("plain", "floor", "before", "after", "before_e2e", "after_e2e",
              "plain_wall", "before_wall", "after_wall")
    times: dict[str, list[float]] = {label: [] for label in labels}
    num_ops: dict[str, int] = {}
    for i in range(repeats):
        c0, t0 = time.thread_time(), time.perf_counter()
        step()
        times["plain"].append(time.thread_time() - c0)
        times["plain_wall"].append(time.perf_counter() - t0)
        with _EmptyFunction(), _EmptyDispatch():
            c0 = time.thread_time()
            step()
            times["floor"].append(time.thread_time() - c0)
        for label in (("before", "after") if i % 2 == 0 else ("after", "before")):
            workload.step = timed_step
            try:
                c0 = time.thread_time()
                capture = captures[label](workload, warmup=0, timed=0, ran_before=True)
                times[label + "_e2e"].append(time.thread_time() - c0)
            finally:
                workload.step = step
            times[label].append(step_cpu_s[0])
            times[label + "_wall"].append(step_wall_s[0])
            num_ops[label] = len(capture.ops)
            del capture
    assert num_ops["before"] == num_ops["after"], num_ops
    ops = num_ops["after"]
    row: dict[str, Any] = {"bench": "capture_ab_cpu", "case": name, "num_ops": ops,
                           "pair": "one-pass, two-pass" if modes else "levers_before, levers",
                           "repeats": repeats,
                           "plain_ms": statistics.median(times["plain"]) * 1e3}
    for label in ("floor", "before", "after", "before_e2e", "after_e2e", "before_wall",
                  "after_wall"):
        plain = times["plain_wall" if label.endswith("_wall") else "plain"]
        per_op = [(t - p) / ops * 1e6 for t, p in zip(times[label], plain)]
        row[label + "_us_per_op"] = {
            "median": statistics.median(per_op), "p10": _quantile(per_op, 0.1),
            "p90": _quantile(per_op, 0.9),
            "min_based": (min(times[label]) - min(plain)) / ops * 1e6,
        }
    for label in ("before", "after"):  # the timed step over the plain step before it
        ratios = [t / p for t, p in zip(times[label], times["plain"])]
        row[label + "_over_plain"] = {"median": statistics.median(ratios),
                                      "p10": _quantile(ratios, 0.1), "p90": _quantile(ratios, 0.9)}
    ratios = [(a - p) / (b - p) for a, b, p in zip(times["after"], times["before"], times["plain"])]
    row["paired_after_over_before"] = statistics.median(ratios)
    env = environment(workload.device)
    row.update(commit=env["levers_commit"], torch=env["torch"], cpu=env["cpu"],
               num_cpus=env["num_cpus"], torch_threads=torch.get_num_threads(),
               load_average_1m=os.getloadavg()[0],
               when=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="directory for capture_ab_cpu.jsonl")
    parser.add_argument("--case", action="append", default=[],
                        help='a workload spec and --set items, e.g. "llama size=tiny"')
    parser.add_argument("--shape", action="append", default=[],
                        help="a shape of bench/capture_overhead.py, at its --smoke size")
    parser.add_argument("--repeats", type=int, default=31)
    parser.add_argument("--modes", action="store_true",
                        help="pair this levers' one-pass (before) and two-pass (after) captures")
    parser.add_argument("--make-before", metavar="REV",
                        help="instead: copy REV's levers as levers_before under --before-dir")
    parser.add_argument("--before-dir", help="where --make-before puts levers_before")
    args = parser.parse_args(argv)
    if args.make_before:
        if not args.before_dir:
            parser.error("--make-before needs --before-dir")
        make_before(args.make_before, args.before_dir)
        return 0
    if not args.out:
        parser.error("--out is required")
    torch.set_num_threads(1)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "capture_ab_cpu.jsonl")
    jobs: list[tuple[str, Callable[[], Any]]] = []
    for case in args.case:
        spec, *sets = case.split()

        def build(spec: str = spec, sets: list[str] = sets) -> Any:
            from levers.loader import load_workload, parse_set

            return load_workload(spec, parse_set(sets))

        jobs.append((case, build))
    for shape in args.shape:
        def build_shape(shape: str = shape) -> Any:
            sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
            import capture_overhead

            return capture_overhead._BUILDERS[shape](torch.device("cpu"), True)[0]

        jobs.append((f"{shape} --smoke", build_shape))
    for name, build in jobs:
        row = measure(name, build(), args.repeats, args.modes)
        existing = open(path).read() if os.path.exists(path) else ""
        atomic_write_text(path, existing + json.dumps(row) + "\n")
        figures = {k: row[k + "_us_per_op"] for k in ("floor", "before", "after", "before_wall",
                                                      "after_wall")}
        print(f"{name:36s} ops={row['num_ops']:5d} us/op (median [p10, p90]): "
              + "  ".join(f"{k} {f['median']:.1f} [{f['p10']:.1f}, {f['p90']:.1f}]"
                          for k, f in figures.items())
              + f"  paired after/before {row['paired_after_over_before']:.2f}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
