"""Diagnostic: does an A/B of two compiled models, alternating step by step, time each side as
it runs alone?

``levers tune`` keeps a lever when its increment (``stack + [lever]`` against ``stack``) pays.
On the H200 (77c16cd) tune kept ``sdpa-cudnn-backend`` on top of ``compile-model`` on the zoo's
ViT at 1.28x and on Qwen2 at 1.76x, while the same stacks timed alone ran no faster than
``compile-model`` alone. This script runs, for one zoo model, the trials tune runs (through
:func:`levers.tune.measure.ab_measure`, each side's median step time printed) and an A/A trial
(the same stack on both sides), then times each stack alone as ``bench/zoo.py`` does (a
synchronize around each step, wall clock), with dynamo's and inductor's counters after each.

    PYTHONPATH=src python bench/ab_alternation.py --model vit --out $OUT/ab_alternation.json
    PYTHONPATH=src python bench/ab_alternation.py --model nanogpt --device cpu --size tiny --out /tmp/a.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from levers.environment import levers_commit_id  # noqa: E402
from levers.output.atomic import atomic_write_text  # noqa: E402
from levers.tune.measure import TrialDesign, ab_measure  # noqa: E402
from levers.workloads import zoo  # noqa: E402


def _counters() -> dict:
    from torch._dynamo.utils import counters

    keep = ("frames", "recompiles", "graph_break", "inductor", "unimplemented")
    return {k: dict(counters[k]) for k in keep if k in counters}


def alone(params: dict, stack: tuple[str, ...], steps: int, warmup: int) -> dict:
    import levers

    workload = zoo.build(**params)
    handle = levers.apply(workload, ",".join(stack)) if stack else None
    for _ in range(warmup):
        workload.step()
    durations = []
    for _ in range(steps):
        if workload.device.type == "cuda":
            torch.cuda.synchronize()
        begin = time.perf_counter()
        workload.step()
        if workload.device.type == "cuda":
            torch.cuda.synchronize()
        durations.append(1e3 * (time.perf_counter() - begin))
    if handle is not None:
        handle.undo()
    return {"stack": list(stack), "median_ms": statistics.median(durations),
            "spread_ms": [min(durations), max(durations)], "counters": _counters()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="vit")
    parser.add_argument("--size", default="full")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--lever", default="sdpa-cudnn-backend")
    parser.add_argument("--base", default="compile-model")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    params = {"model": args.model, "size": args.size, "device": args.device, "layers": args.layers}
    base = tuple(args.base.split(","))
    stack = (*base, args.lever)
    measure = ab_measure("zoo", params, TrialDesign())
    rows = []
    for label, (b, s) in {
        "base vs default": ((), base),
        "A/A": (base, base),
        "increment": (base, stack),
        "stack vs default": ((), stack),
    }.items():
        started = time.perf_counter()
        trial = measure(b, s, None)
        rows.append({"trial": label, "base": list(b), "stack": list(s),
                     "step_ms": trial.step_ms, "tokens_per_s_ratio": trial.tokens_per_s_ratio,
                     "ci95": trial.tokens_per_s_ci95, "decision": trial.decision,
                     "error": trial.error, "wall_s": time.perf_counter() - started,
                     "counters": _counters()})
        print(json.dumps(rows[-1])[:400], flush=True)
    for s in ((), base, stack):
        try:
            rows.append({"trial": "alone", **alone(params, s, steps=20, warmup=5)})
        except Exception as exc:  # noqa: BLE001 - a stack that does not apply here is a row
            rows.append({"trial": "alone", "stack": list(s), "error": f"{type(exc).__name__}: {exc}"})
        print(json.dumps(rows[-1])[:300], flush=True)
    meta = {"commit": levers_commit_id(), "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
            "params": params}
    atomic_write_text(args.out, json.dumps({"meta": meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
