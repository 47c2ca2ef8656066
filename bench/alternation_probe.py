"""Benchmark probe: does alternating two variants step by step change what each is timed at?

ab's A/Bs and the sweep's head-to-head alternate their two sides step by step (each step from an
idle device); the sweep's variant rows time each variant in a block of its own. On an H100 at
12c91b9 (s51) they disagreed on timm's test_efficientnet: in their blocks tune's stack
(compile-model + channels-last) ran 3.5 ms a step and ``model.compile(mode="reduce-overhead")``
2.8 ms, alternated both ran 3.6 ms; and tune's alternated A/Bs kept channels-last on top of
compile-model at 1.071x where a block-timed probe (s50) put it at 0.943x. Two CUDA-graph
programs alternated share inductor's graph-tree manager and may pay to switch between them.

For each pair of variants (A;B) on one model, both built side by side (seed 0), warmed up, then
timed three ways in one process: in blocks (all of A's steps, then all of B's), alternated step
by step (the order swapped every pair, as the sweep's head-to-head does), and alternated in
windows of ``--window`` steps. Each step is timed from an idle device to an idle device (a sync
before and after it). Per way: each side's median step time and B's tokens/s over A's, with a
CI95 (paired bootstrap where the steps pair, else resampled apart). A variant is a stack of
levers (``compile-model+channels-last``) or a peer of ``bench/tune_sweep.py``
(``peer:compile-model-ro``).

    PYTHONPATH=src python bench/alternation_probe.py --models arch@timm:test_efficientnet \\
        --pairs "compile-model;compile-model+channels-last|peer:compile-model-ro;compile-model+channels-last" \\
        --out $OUT/alternation
    # the whole path on a CPU (dynamo's eager backend)
    PYTHONPATH=src python bench/alternation_probe.py --models zoo@nanogpt --size tiny \\
        --device cpu --pairs "compile-model;sdpa-attention" --steps 4 --out /tmp/alt

Writes ``OUT/summary.json`` after every pair.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from levers_vs_peers import _bootstrap, steps_to_fill  # noqa: E402
from stack_probe import _peer, peer_error  # noqa: E402
from tune_sweep import (  # noqa: E402
    TUNED, _environment, _merge, _variant_run, model_params, schedule, side_by_side,
    timed_in_turn, warm_pace_s,
)

from levers.ab.stats import paired_ratio_ci  # noqa: E402
from levers.output.atomic import atomic_write_text  # noqa: E402

WAYS = ("blocks", "alternated", "windows")
# the most steps a side min_timed_s may ask for, per way
MAX_STEPS = 400


def read(durations: tuple[list[float], list[float]], paired: bool, rng: random.Random
         ) -> dict[str, Any]:
    """Each side's median step (ms) and B's tokens/s over A's (A's step time over B's), CI95."""
    a, b = durations
    if paired:
        ci = paired_ratio_ci([1 / d for d in a], [1 / d for d in b], num_resamples=2000, seed=0)
        ratio, ci95 = ci.ratio, [ci.lo, ci.hi]
    else:
        ratio = statistics.median(a) / statistics.median(b)
        ci95 = _bootstrap(a, b, lambda x, y: statistics.median(x) / statistics.median(y), rng)
    return {"median_ms": [1e3 * statistics.median(a), 1e3 * statistics.median(b)],
            "b_over_a": ratio, "ci95": ci95, "steps": len(a)}


def probe_pair(spec: str, params: dict[str, Any], pair: list[list[str]], args) -> dict[str, Any]:
    """One pair built side by side and timed in each of :data:`WAYS`; a pair that cannot run is
    a row that says why."""
    names = ["+".join(stack) for stack in pair]
    out: dict[str, Any] = {"pair": names}
    cleanups: list[Callable[[], None]] = []
    sides: dict[str, Any] = {}
    with _variant_run(out, args, cleanups, sides):
        variants = [(name, _peer(stack) or TUNED, [] if _peer(stack) else stack)
                    for name, stack in zip(names, pair)]
        workloads = side_by_side(spec, params, variants, cleanups, sides)
        steps = steps_to_fill(args.steps, args.min_timed_s, warm_pace_s(workloads, args.warmup),
                              MAX_STEPS)
        rng = random.Random(0)
        out["ways"] = {}
        for way in WAYS:
            a, b = timed_in_turn(workloads, schedule(way, steps, args.window))
            out["ways"][way] = read((a, b), paired=way != "blocks", rng=rng)
        out["status"] = "ok"
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", required=True, help="SPEC@MODEL, comma-separated")
    parser.add_argument("--pairs", required=True,
                        help="pairs separated by '|', the two variants of a pair by ';', levers "
                             "in a variant by '+' (peer:NAME: a peer of tune_sweep.py)")
    parser.add_argument("--size", default="full")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--set", action="append", default=[], metavar="K=V")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20, help="timed steps a side, at least")
    parser.add_argument("--min-timed-s", type=float, default=2.0,
                        help="time each side of each way at least this long")
    parser.add_argument("--window", type=int, default=10, help="steps in a window")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--debug", action="store_true")
    args = parser.parse_args(argv)
    pairs = [[[lever for lever in v.split("+") if lever] for v in p.split(";")]
             for p in args.pairs.split("|") if p]
    for pair in pairs:  # before anything is built
        if len(pair) != 2 or not all(pair):
            parser.error(f"{pair}: a pair is two variants separated by ';'")
        for stack in pair:
            why = peer_error(stack, "variant")
            if why is not None:
                parser.error(f"{'+'.join(stack)}: {why}")
    if args.steps < 2 or args.window < 1:
        parser.error("--steps must be at least 2 and --window at least 1")
    extra = dict(item.split("=", 1) for item in args.set)
    summary = args.out / "summary.json"
    for entry in [m.strip() for m in args.models.split(",") if m.strip()]:
        spec, model = entry.rsplit("@", 1)
        params = {**model_params(spec, model, args.size, args.device), **extra}
        row: dict[str, Any] = {"model": entry, "size": args.size, "budget_s": 0, "params": params,
                               "window": args.window, "pairs": [], **_environment()}
        for pair in pairs:
            started = time.perf_counter()
            one = probe_pair(spec, params, pair, args)
            one["wall_s"] = round(time.perf_counter() - started, 1)
            row["pairs"].append(one)
            shown = {w: (round(r["b_over_a"], 3), [round(x, 3) for x in r["ci95"]],
                         [round(m, 2) for m in r["median_ms"]])
                     for w, r in one.get("ways", {}).items()}
            print(f"{entry}: {' vs '.join(one['pair'])} {one.get('status')} "
                  f"{one.get('error', '')} {shown} wall {one['wall_s']}s", flush=True)
            atomic_write_text(summary, json.dumps({"rows": _merge(summary, row)}, indent=1,
                                                  default=str) + "\n", make_parents=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
