"""Benchmark: a Hugging Face mixture of experts on one GPU, the guide's MoE advice measured.

The zoo's ``mixtral`` (:mod:`levers.workloads.zoo`; ``full``: width 1024, 8 blocks, 8 experts of
ffn 3584, 2 per token, about 0.8e9 parameters, batch 4 x 1024 tokens, fp32 master weights, bf16
autocast, fused AdamW), one row per variant, each from a fresh model built from the same seed
after ``torch._dynamo.reset()``. A variant is ``+``-joined parts applied in order:

- ``default``: the model as transformers builds it (its experts implementation is its default);
- ``experts-eager``: ``set_experts_implementation("eager")``, the loop over experts a model keeps
  when it was saved or asked for it (the grouped-GEMM lever's starting point);
- ``b=N``: the batch (the guide: raise the batch first on a MoE);
- ``compile-model``, ``compile-model-ro``: the peers' whole-model compile, default mode and
  ``reduce-overhead`` (CUDA graphs; each step marked with ``cudagraph_mark_step_begin``);
- ``lever:ID``: ``levers.apply`` of that lever (``experts-grouped-mm``, ``compile-blocks``,
  ``ac-full``, ``float8``, ``grouped-mm-autocast``, ...).

(At ef32dbf the ``grouped-mm-autocast`` row was a variant ``experts-autocast`` of this script
whose patch of transformers' ``_grouped_mm`` is the lever's wrapper.)

Per row: median step time, tokens/s with spread and bootstrap CI95 (over steps), the median
per-step peak allocated and the peak reserved, the warm-up time, the experts implementation that
ran, what dynamo did (frames, recompiles, graph breaks) and the error where the variant failed.
Per variant against ``--baseline`` (rows of one run only): the tokens/s ratio with CI95.
``OUT/moe.json`` is written atomically after every row.

    PYTHONPATH=src python bench/moe.py --out $OUT/moe_h200                       # on the H200
    PYTHONPATH=src python bench/moe.py --device cpu --size tiny --steps 2 --out /tmp/moe   # smoke
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import random
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

import levers  # noqa: E402
from levers.capture import compile_stats  # noqa: E402
from levers.environment import levers_commit_id  # noqa: E402
from levers.levers import load_all  # noqa: E402
from levers.levers.lever import NotApplicable  # noqa: E402
from levers.output.atomic import atomic_write_text  # noqa: E402
from levers.workloads import zoo  # noqa: E402
from levers_vs_peers import _bootstrap, measure  # noqa: E402
from zoo import compile_summary, summarise  # noqa: E402

VARIANTS = (
    "default", "experts-eager", "experts-eager+lever:experts-grouped-mm",
    "lever:grouped-mm-autocast", "lever:grouped-mm-autocast+lever:compile-blocks",
    "b=16+lever:grouped-mm-autocast",
    "b=8", "b=16", "lever:ac-full", "b=16+lever:ac-full",
    "compile-model", "compile-model-ro", "lever:compile-blocks", "lever:float8",
)


def _graph_step(step: Callable[[], Any]) -> Callable[[], Any]:
    def graph_step() -> Any:
        torch.compiler.cudagraph_mark_step_begin()
        return step().clone()

    return graph_step


def _implementation(model: torch.nn.Module) -> Any:
    getter = getattr(model, "get_experts_implementation", None)
    return getter() if callable(getter) else None


def run_row(variant: str, args) -> dict[str, Any]:
    parts = variant.split("+")
    row: dict[str, Any] = {"model": args.model, "size": args.size, "variant": variant}
    params: dict[str, Any] = {"model": args.model, "size": args.size, "device": args.device}
    for part in parts:
        if part.startswith("b="):
            params["batch_size"] = int(part[2:])
    undos: list[Callable[[], None]] = []
    torch._dynamo.reset()
    before = compile_stats.snapshot()
    workload = None
    try:
        workload = zoo.build(**params)
        row["batch_size"] = workload.params["batch_size"]
        row["tokens_per_step"] = workload.tokens_per_step
        row["shape"] = " ".join(f"{k}={workload.params[k]}" for k in ("size", "batch_size", "layers"))
        for part in parts:
            if part in ("default",) or part.startswith("b="):
                continue
            if part == "experts-eager":
                workload.model.set_experts_implementation("eager")
            elif part == "compile-model":
                workload.model.compile()
            elif part == "compile-model-ro":
                if workload.device.type != "cuda":
                    raise LookupError("reduce-overhead (CUDA graphs) needs a GPU")
                workload.model.compile(mode="reduce-overhead")
                workload.step = _graph_step(workload.step)
            elif part.startswith("lever:"):
                handle = levers.apply(workload, part[len("lever:"):])
                row.setdefault("applied", []).extend(handle.applied)
                undos.append(handle.undo)
            else:
                raise ValueError(f"unknown part {part!r} of {variant!r}")
        row["experts_implementation"] = _implementation(workload.model)
        row.update(measure(workload, args.warmup, args.steps))
        row["status"] = "ok"
    except (LookupError, NotApplicable) as exc:
        row["status"], row["error"] = "not-applicable", f"{type(exc).__name__}: {exc}"[:600]
    except Exception as exc:  # noqa: BLE001 - a failing variant is a result, not a crash
        row["status"], row["error"] = "failed", f"{type(exc).__name__}: {exc}"[:600]
        traceback.print_exc()
    finally:
        row["compile"] = compile_summary(before)
        for undo in reversed(undos):
            undo()
        workload = None
        torch._dynamo.reset()
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return row


def _tokens_ratio(row: dict[str, Any], base: dict[str, Any], rng: random.Random):
    """The row's median tokens/s over the base's, and its bootstrap CI95 over steps."""
    a, b = row["tokens_per_s_samples"], base["tokens_per_s_samples"]
    ratio = lambda x, y: statistics.median(x) / statistics.median(y)  # noqa: E731
    return ratio(a, b), _bootstrap(a, b, ratio, rng)


def ratios(rows: list[dict[str, Any]], baseline: str, rng: random.Random) -> dict[str, Any]:
    ok = {r["variant"]: r for r in rows if r.get("status") == "ok"}
    base = ok.get(baseline)
    if base is None:
        return {}
    out = {}
    for name, row in ok.items():
        value, ci95 = _tokens_ratio(row, base, rng)
        out[name] = {"tokens_per_s_ratio": value, "tokens_per_s_ratio_ci95": ci95}
    return out


# catalogue rows (levers list): (lever, its variant, the baseline variant)
CATALOGUE = (
    ("experts-grouped-mm", "experts-eager+lever:experts-grouped-mm", "experts-eager"),
    ("grouped-mm-autocast", "lever:grouped-mm-autocast", "default"),
    ("grouped-mm-autocast", "b=16+lever:grouped-mm-autocast", "b=16"),
    ("compile-blocks", "lever:grouped-mm-autocast+lever:compile-blocks", "lever:grouped-mm-autocast"),
    ("compile-blocks", "lever:compile-blocks", "default"),
    ("ac-full", "lever:ac-full", "default"),
    ("ac-full", "b=16+lever:ac-full", "b=16"),
)
# the name an earlier revision gave a variant, for reading its results
RENAMED = {"experts-autocast": "lever:grouped-mm-autocast"}


def _peak_delta(row: dict[str, Any], base: dict[str, Any]) -> float | None:
    if not row["peak_allocated_samples"] or not base["peak_allocated_samples"]:
        return None  # a CPU run
    peak = lambda r: statistics.median(r["peak_allocated_samples"])  # noqa: E731
    return peak(row) - peak(base)


def catalogue(doc: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """The levers' rows of one run, in the catalogue's form (levers.levers.catalogue)."""
    rows = {RENAMED.get(r["variant"], r["variant"]): r for r in doc["rows"] if r.get("status") == "ok"}
    out = []
    for lever, variant, baseline in CATALOGUE:
        row, base = rows.get(variant), rows.get(baseline)
        if row is None or base is None:
            continue
        value, ci95 = _tokens_ratio(row, base, rng)
        out.append({
            "lever": lever, "levers": [lever], "workload": "zoo",
            "shape": f"model={doc['rows'][0]['model']} {row['shape']}",
            "baseline": baseline, "gpu": doc["gpu"], "torch": doc["torch"],
            "commit": doc["commit"], "date": doc["date"], "status": "ok",
            "tokens_per_s_ratio": value, "tokens_per_s_ratio_ci95": ci95,
            "peak_allocated_delta_bytes": _peak_delta(row, base), "peak_reserved_delta_bytes": None,
            "peak_allocated_delta_ci95": None, "error": None,
        })
    return {k: doc[k] for k in ("gpu", "torch", "commit", "date")} | {"rows": out}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="directory of moe.json")
    parser.add_argument("--model", default="mixtral", help="a zoo model (mixtral)")
    parser.add_argument("--size", default="full", choices=zoo.spec.SIZES)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--baseline", default="default", help="the variant ratios are against")
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--budget-s", type=float, default=None, help="start no row past this")
    parser.add_argument("--catalogue-out", type=Path, default=None,
                        help="also write the levers' rows to this directory's catalogue.json")
    parser.add_argument("--catalogue-from", type=Path, default=None,
                        help="write --catalogue-out from this moe.json and run nothing")
    args = parser.parse_args(argv)
    if args.catalogue_from is not None:
        if args.catalogue_out is None:
            raise SystemExit("--catalogue-from needs --catalogue-out")
        _write_catalogue(json.loads(args.catalogue_from.read_text(encoding="utf-8")), args.catalogue_out)
        return 0
    if args.model not in zoo.MODELS:
        raise SystemExit(f"--model {args.model}: not a zoo model; models: {', '.join(zoo.MODELS)}")
    load_all()
    rng = random.Random(0)
    start = time.monotonic()
    meta = {"commit": levers_commit_id(), "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join(sys.argv)}
    try:
        import transformers
        meta["transformers"] = transformers.__version__
    except ImportError:
        pass
    rows: list[dict[str, Any]] = []
    for variant in [v for v in args.variants.split(",") if v]:
        if args.budget_s is not None and time.monotonic() - start > args.budget_s:
            print(f"budget: {variant} not started", flush=True)
            continue
        print(f"== {variant}", flush=True)
        row = run_row(variant, args)
        summarise(row, rng)
        rows.append(row)
        print(f"   {row['status']} {row.get('step_ms', 0):.1f} ms  {row.get('tokens_per_s', 0):.0f} "
              f"tokens/s  peak {(row.get('peak_allocated_bytes') or 0) / 2**30:.2f} GiB  "
              f"{row.get('experts_implementation')} {row.get('error', '')}", flush=True)
        doc = {**meta, "rows": rows, "vs_baseline": ratios(rows, args.baseline, rng)}
        args.out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(args.out / "moe.json", json.dumps(doc, indent=2) + "\n")
        if args.catalogue_out is not None:
            _write_catalogue(doc, args.catalogue_out)
    return 0


def _write_catalogue(doc: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    rows = catalogue(doc, random.Random(0))
    atomic_write_text(out / "catalogue.json", json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
