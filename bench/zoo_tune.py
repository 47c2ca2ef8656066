"""Benchmark: issue 20's goals on the model zoo, one row per model: the audit's claims against
their A/Bs, ``levers tune``'s stack, and that stack timed beside the peers in the same process.

    # on the H200 (each model a few minutes: the audit's A/Bs, tune's search, then the rows)
    PYTHONPATH=src python bench/zoo_tune.py --only gpt2,timm-vit --tune-budget 100 --out $OUT/zoo_h200
    # a tiny CPU run (dynamo's eager backend in the compile rows; the search on the CPU levers)
    PYTHONPATH=src python bench/zoo_tune.py --device cpu --size tiny --only nanogpt --out /tmp/zt

For each model (the ``zoo`` workload at the shape ``bench/zoo.py --quick`` uses):

1. ``levers.Step("zoo", params).audit(measure=True)``: the recommended levers, each A/B'd alone
   on this step and then as a stack (:mod:`levers.tune.claims`). Per lever: ``estimated_ms``
   (the audit's roofline figure before the A/B), ``measured_ms`` (the A/B's median step time
   saved), ``parity``, ``pays``; ``claimed_ms`` is what the audit prints on the GPU after
   measuring (the measured figure where it measured one, else the estimate).
2. ``Step.tune(budget=...)``: the proven stack and its tokens/s ratio with CI95.
3. ``bench/zoo.py``'s rows in this process: the default, the peers (per-layer compile,
   whole-model compile, its ``reduce-overhead`` form, Liger Kernel where it has a patch) and the
   tuned stack, so ``vs_best_peer`` compares runs of one process on one GPU.

Writes ``OUT/tuned.json`` (rows merged by model and size, with the commit, torch, GPU, date) and
appends the zoo rows to ``OUT/summary.json`` as ``bench/zoo.py`` does.
"""

from __future__ import annotations

import argparse
import datetime
import json
import random
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

import levers  # noqa: E402
from levers.environment import levers_commit_id  # noqa: E402
from levers.levers import load_all  # noqa: E402
from levers.output.atomic import atomic_write_text  # noqa: E402
from levers.workloads import zoo as zoo_workloads  # noqa: E402

import zoo as zoo_bench  # noqa: E402  (bench/zoo.py)

PEER_ROWS = ("compile-layers", "compile-model", "compile-model-ro", "liger")
TUNED = "levers-stack"  # bench/zoo.py's stack variant, here given tune's stack


def _claims(audited: Any) -> list[dict[str, Any]]:
    measured = getattr(audited, "claims", None)
    if measured is None:
        return []
    out = []
    for claim in measured.claims:
        trial = claim.trial
        out.append({
            "id": claim.lever,
            "codes": list(claim.codes),
            "estimated_ms": claim.claimed_ms,
            "audit_ab_ms": claim.measured_ms,
            # what the audit prints on the GPU: its A/B's saving where it measured one
            "claimed_ms": claim.measured_ms if claim.measured_ms is not None else claim.claimed_ms,
            "measured_ms": None,  # this process's own rows (compare)
            "alternative_of": claim.alternative_of,
            "estimate_error": (abs(claim.claimed_ms - claim.measured_ms) / abs(claim.measured_ms)
                               if claim.measured_ms else None),
            "parity": getattr(trial, "parity", None),
            "pays": claim.pays,
            "why": claim.why,
            "tokens_per_s_ratio_ci95": getattr(trial, "tokens_per_s_ci95", None),
        })
    return out


def tune_model(model: str, args, options: dict[str, Any]) -> dict[str, Any]:
    params = zoo_bench.build_params(model, args)
    entry = zoo_workloads.MODELS[model]
    row: dict[str, Any] = {"model": model, "family": entry.family, "size": args.size,
                           "shape": " ".join(f"{k}={v}" for k, v in params.items()
                                             if k not in ("model", "device"))}
    t0 = time.perf_counter()
    try:
        step = levers.Step("zoo", params=params)
        step.capture(warmup=2, timed=3)
        audited = step.audit(measure=args.device == "cuda")
        row["levers"] = _claims(audited)
        rec = audited.report.recommendation if hasattr(audited, "report") else None
        row["audit_stack"] = list(getattr(rec, "levers", ()) or ())
        row["audit_stack_provenance"] = getattr(rec, "provenance", None)
        row["audit_s"] = time.perf_counter() - t0
    except Exception as exc:  # noqa: BLE001 - a failing audit is a result
        row["audit_error"] = f"{type(exc).__name__}: {exc}"[:600]
        if args.debug:
            traceback.print_exc()
        step = levers.Step("zoo", params=params)
    t1 = time.perf_counter()
    try:
        result = step.tune(budget=args.tune_budget)
        row["stack"] = list(result.stack)
        proof = result.proof
        row["tokens_per_s_ratio"] = getattr(proof, "tokens_per_s_ratio", None)
        row["tokens_per_s_ratio_ci95"] = getattr(proof, "tokens_per_s_ci95", None)
        row["parity"] = getattr(proof, "parity", None)
        row["nothing_pays"] = result.nothing_pays
        row["outcomes"] = [dict(o.__dict__) for o in result.outcomes]
        row["tune_s"] = time.perf_counter() - t1
    except Exception as exc:  # noqa: BLE001
        row["tune_error"] = f"{type(exc).__name__}: {exc}"[:600]
        row["stack"] = []
        if args.debug:
            traceback.print_exc()
    return row


def recommended(row: dict[str, Any]) -> list[str]:
    """The levers the audit recommends after measuring (its proven stack), in order."""
    return list(row.get("audit_stack") or [])


def same_run_rows(model: str, row: dict[str, Any], args, options: dict[str, Any]) -> list[dict]:
    """The default, the peers, the tuned stack and each lever the audit recommends alone,
    timed by bench/zoo.py in this process (independent of the audit's and tune's own A/Bs)."""
    stack = row.get("stack", [])
    rows = []
    variants = ["default", *PEER_ROWS]
    if stack:
        zoo_bench.STACK = tuple(stack)
        variants.append(TUNED)
    for lever in recommended(row):
        if [lever] != list(stack):  # a one-lever stack equal to tune's is its row already
            variants.append(f"lever:{lever}")
    for variant in variants:
        one = zoo_bench.run_row(model, variant, args, options)
        one["stack"] = list(stack) if variant == TUNED else None
        zoo_bench.summarise(one, args.rng)
        rows.append(one)
        figure = one.get("tokens_per_s") or one.get("error", "")
        print(f"  {model}:{variant} {one['status']} {figure}", flush=True)
    return rows


def compare(row: dict[str, Any], rows: list[dict[str, Any]], rng: random.Random) -> None:
    ok = {r["variant"]: r for r in rows if r.get("status") == "ok"}
    base = ok.get("default")
    if base is None:
        return
    med = statistics.median
    ratio = lambda x, y: med(x) / med(y)  # noqa: E731
    peers = {v: ratio(r["tokens_per_s_samples"], base["tokens_per_s_samples"])
             for v, r in ok.items() if v in PEER_ROWS}
    row["peers"] = peers
    row["best_peer"] = max(peers, key=peers.get) if peers else None
    tuned = ok.get(TUNED)
    ours = (ratio(tuned["tokens_per_s_samples"], base["tokens_per_s_samples"])
            if tuned else 1.0)  # an empty stack runs the default
    row["same_run_tuned_ratio"] = ours
    if tuned:
        row["same_run_tuned_ratio_ci95"] = zoo_bench._bootstrap(
            tuned["tokens_per_s_samples"], base["tokens_per_s_samples"], ratio, rng)
    if row["best_peer"]:
        row["vs_best_peer"] = ours / peers[row["best_peer"]]
    # each recommended lever: what the audit printed against this process's own rows
    stack = row.get("stack") or []
    for claim in row.get("levers", []):
        if claim["id"] not in recommended(row):
            continue
        own = ok.get(TUNED) if [claim["id"]] == list(stack) else ok.get(f"lever:{claim['id']}")
        if own is None:
            continue
        # per-token time, so a lever that changes the batch is read on the same footing
        base_ms = 1e3 * base["tokens_per_step"] / med(base["tokens_per_s_samples"])
        own_ms = 1e3 * base["tokens_per_step"] / med(own["tokens_per_s_samples"])
        claim["measured_ms"] = base_ms - own_ms
        claim["measured_by"] = "bench/zoo.py row in the same process, default minus lever"
        claim["claim_error"] = (abs(claim["claimed_ms"] - claim["measured_ms"])
                                / abs(claim["measured_ms"]) if claim["measured_ms"] else None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--only", required=True, help="zoo models, comma-separated")
    parser.add_argument("--tune-budget", default="100", help="levers tune's budget per model")
    parser.add_argument("--size", default="full")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--budget-s", type=float, default=560.0,
                        help="start no model after this many seconds")
    parser.add_argument("--debug", action="store_true")
    args = parser.parse_args(argv)
    models = [m.strip() for m in args.only.split(",") if m.strip()]
    unknown = [m for m in models if m not in zoo_workloads.MODELS]
    if unknown:
        raise SystemExit(f"unknown zoo models {unknown}; models: {', '.join(zoo_workloads.MODELS)}")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA GPU here; use --device cpu --size tiny")
    args.quick, args.steps, args.warmup, args.rng = True, 8, 2, random.Random(0)
    options = {"backend": "eager"} if args.device == "cpu" else {}
    load_all()
    meta = {"commit": levers_commit_id() or "unknown", "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    path = args.out / "tuned.json"
    old = json.loads(path.read_text()).get("rows", []) if path.exists() else []
    started, done, zoo_rows = time.perf_counter(), [], []
    for model in models:
        if time.perf_counter() - started > args.budget_s:
            print(f"budget of {args.budget_s:.0f}s spent: {model} and after not run")
            break
        t0 = time.perf_counter()
        row = tune_model(model, args, options)
        rows = same_run_rows(model, row, args, options)
        compare(row, rows, args.rng)
        row.update(meta)
        for r in rows:
            r.update(meta)
        done.append(row)
        zoo_rows += rows
        print(f"{model}: stack {row.get('stack')} ratio {row.get('tokens_per_s_ratio')} "
              f"vs best peer {row.get('vs_best_peer')} in {time.perf_counter() - t0:.0f}s",
              flush=True)
        key = lambda r: (r.get("model"), r.get("size"))  # noqa: E731
        kept = [r for r in old if key(r) not in {key(d) for d in done}]
        args.out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps({"rows": kept + done, "command": " ".join(sys.argv)},
                                           indent=2, default=str) + "\n")
        zoo_bench.write(args.out, zoo_rows, args.rng)
    return 0


if __name__ == "__main__":
    sys.exit(main())
