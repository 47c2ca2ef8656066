"""Benchmark probe: stacks of levers timed side by side on one model, in one process, beside
the default step (``bench/tune_sweep.py``'s ``timed_row``: each built fresh from the same seed
after ``torch._dynamo.reset()``, 3 warm-up and 10 timed steps, median tokens/s).

It answers "does this form beat that one here" before a form becomes one of tune's candidates:
issue 33 asks tune to get ahead of the best peer (usually whole-model compile with CUDA graphs),
so a form such as ``compile-model:mode=max-autotune`` is timed against ``compile-model`` first.

    PYTHONPATH=src python bench/stack_probe.py --models zoo@llama,zoo@gpt2 \
        --stacks "compile-model;compile-model:mode=max-autotune" --out $OUT/stack_probe
    # the whole path on a CPU (dynamo's eager backend)
    PYTHONPATH=src python bench/stack_probe.py --models zoo@nanogpt --size tiny --device cpu \
        --stacks "compile-model" --out /tmp/sp

A stack may hold any lever spec; ``channels-last`` (a lever since s47, a probe's transform of the
model before) is timed alone and under whole-model compile on convnets:

    PYTHONPATH=src python bench/stack_probe.py --models zoo@resnet,zoo@convnext \
        --stacks "compile-model;channels-last+compile-model;channels-last" --out $OUT/cl

A stack ``peer:NAME`` is a peer of ``bench/tune_sweep.py`` (``peer:compile-model-ro``:
``model.compile(mode="reduce-overhead")``), timed as the sweep times it, beside levers' own forms:

    PYTHONPATH=src python bench/stack_probe.py --models arch@timm:test_efficientnet \
        --stacks "peer:compile-model-ro;compile-model;compile-model+channels-last" --out $OUT/ro

``--rounds R`` times the default and the stacks R times, each round a fresh build of each, the
order reversed every other round (a drift over the session lands on both ends alike): whether
one stack's block moves between builds more than the stacks differ. On timm's
test_efficientnet (H100, s52: 2-3 ms steps) one program's median moved 10-15% from one block to
the next in one process:

    PYTHONPATH=src python bench/stack_probe.py --models arch@timm:test_efficientnet --rounds 3 \
        --stacks "peer:compile-model-ro;compile-model;compile-model+channels-last" --out $OUT/ro

Writes ``OUT/summary.json`` after every stack: per model its timed rows (a later round's named
``NAME#R``), each stack's tokens/s ratio to the default (``ratios``) and to the first stack
(``vs_first``) in the first round, with more than one round each variant's median step per
round (``rounds_ms``) and their spread, (largest - smallest) / smallest (``spread``), with the
environment.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from tune_sweep import (  # noqa: E402
    PEER_TRANSFORMS, TUNED, _environment, _merge, in_rounds, model_params, round_name, spread,
    timed_row,
)
from levers.output.atomic import atomic_write_text  # noqa: E402
from levers_vs_peers import _bootstrap  # noqa: E402


PEER_PREFIX = "peer:"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", required=True, help="SPEC@MODEL, comma-separated")
    parser.add_argument("--stacks", required=True,
                        help="stacks separated by ';', levers in a stack by '+'")
    parser.add_argument("--size", default="full")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--set", action="append", default=[], metavar="K=V")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--min-timed-s", type=float, default=3.0,
                        help="time each stack at least this long (more steps on short ones)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="time the default and the stacks this many times, fresh builds, "
                             "the order reversed every other round")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--debug", action="store_true")
    args = parser.parse_args(argv)
    stacks = [[lever for lever in s.split("+") if lever] for s in args.stacks.split(";") if s]
    if not stacks:
        parser.error("--stacks names no stack")
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    for stack in stacks:  # before anything is built
        why = peer_error(stack)
        if why is not None:
            parser.error(f"{'+'.join(stack)}: {why}")
    extra = dict(item.split("=", 1) for item in args.set)
    summary = args.out / "summary.json"
    rng = random.Random(0)
    for entry in [m.strip() for m in args.models.split(",") if m.strip()]:
        spec, model = entry.rsplit("@", 1)
        params = {**model_params(spec, model, args.size, args.device), **extra}
        row = {"model": entry, "size": args.size, "budget_s": 0, "params": params,
               "stacks": ["+".join(s) for s in stacks], "rows": [], **_environment()}
        blocks = [("default", []), *[("+".join(s), s) for s in stacks]]
        for (name, stack), number in in_rounds(blocks, args.rounds):
            started = time.perf_counter()
            peer = _peer(stack)
            variant = peer or ("default" if not stack else TUNED)
            one = timed_row(spec, params, variant, [] if peer else stack, args)
            one.pop("describe", None)
            shown = round_name(name, number)
            one.update(variant=shown, round=number,
                       wall_s=round(time.perf_counter() - started, 1))
            row["rows"].append(one)
            if args.rounds > 1:
                row.update(_rounds(row["rows"]))
            ok = {r["variant"]: r["tokens_per_s_samples"] for r in row["rows"]
                  if r.get("status") == "ok"}
            med = statistics.median
            ratio = lambda x, y: med(x) / med(y)  # noqa: E731
            if "default" in ok:
                row["ratios"] = {v: ratio(s, ok["default"]) for v, s in ok.items() if v != "default"}
            first = "+".join(stacks[0])
            if first in ok:
                row["vs_first"] = {v: [ratio(s, ok[first]), _bootstrap(s, ok[first], ratio, rng)]
                                   for v, s in ok.items() if v not in ("default", first)}
            print(f"{entry}:{shown} {one['status']} {one.get('error', '')} "
                  f"{row.get('ratios', {}).get(shown, '')} wall {one['wall_s']}s", flush=True)
            atomic_write_text(summary, json.dumps({"rows": _merge(summary, row)}, indent=1,
                                                  default=str) + "\n", make_parents=True)
    return 0


def _rounds(rows: list[dict]) -> dict:
    """Each variant's median step (ms) in each round timed so far, and their spread."""
    per: dict[str, list[float]] = {}
    for row in sorted(rows, key=lambda r: r["round"]):
        if row.get("status") != "ok" or not row.get("dur_s"):
            continue
        per.setdefault(row["variant"].split("#")[0], []).append(
            1e3 * statistics.median(row["dur_s"]))
    return {"rounds_ms": per, "spread": spread(per)}


def peer_error(stack: list[str], what: str = "stack") -> str | None:
    """Why ``stack`` cannot be timed, where it names a peer (one not in the sweep's, or beside
    levers: a peer is a ``what`` of its own), or None."""
    if any(lever.startswith(PEER_PREFIX) for lever in stack) and (
            len(stack) > 1 or _peer(stack) not in PEER_TRANSFORMS):
        return (f"a peer is a {what} of its own, one of "
                f"{', '.join(PEER_PREFIX + p for p in PEER_TRANSFORMS)}")
    return None


def _peer(stack: list[str]) -> str | None:
    """The peer a stack names (``peer:NAME``), or None for a stack of levers."""
    if stack[:1] and stack[0].startswith(PEER_PREFIX):
        return stack[0].removeprefix(PEER_PREFIX)
    return None


if __name__ == "__main__":
    raise SystemExit(main())
