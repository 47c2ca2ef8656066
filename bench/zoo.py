"""Benchmark: the model zoo on one GPU, the default step against per-layer and whole-model
compile, Liger Kernel where it supports the model, and levers' compile levers and stack.

    # on the H200: every model at its full shape, the quick set of variants (< 10 minutes)
    PYTHONPATH=src python bench/zoo.py --quick --out $OUT/zoo_h200
    # every variant of a few models
    PYTHONPATH=src python bench/zoo.py --only gpt2,timm-vit --out $OUT/zoo_h200
    # a tiny CPU run of every row (the eager backend: dynamo's tracing, no inductor)
    PYTHONPATH=src python bench/zoo.py --device cpu --size tiny --out /tmp/zoo

Models are the ``zoo`` workload's (:mod:`levers.workloads.zoo`), built from their default
configs as shipped (``use_cache=True`` and dropout included), fresh from the same seed for every
variant, after ``torch._dynamo.reset()``; bf16 autocast and fused AdamW on the GPU. ``--only``
takes model names or ``model:variant``. Variants:

- ``default``: the step as built.
- peers, as a user writes them: ``compile-layers`` (``block.compile()`` on each repeated block),
  ``compile-model`` (``model.compile()``), ``compile-model-ro`` (``mode="reduce-overhead"``,
  each step marked with ``torch.compiler.cudagraph_mark_step_begin``), ``liger`` (Liger Kernel's
  ``apply_liger_kernel_to_<model_type>`` where it has one; optional import).
- levers: ``lever:compile-blocks``, ``lever:compile-model`` (mode=auto), ``levers-stack``
  (:data:`STACK`, what does not apply skipped and said).

``--quick`` runs :data:`QUICK_VARIANTS` (the default, both peers' compiles and both levers) with 2 warm-up and 8 timed steps, and caps the decoders' depth at
:data:`QUICK_MAX_LAYERS` blocks (the shape says so), so that 8+ models fit one 10-minute call;
``--budget-s`` stops starting rows past a deadline (what ran is written).

Per row: the median step time and tokens/s of the timed steps with their spread (min, max) and
the tokens/s CI95 by bootstrap over steps; the warm-up time (compile included); the median
per-step peak allocated (peak stats reset before each step); what torch.compile did in the row
(frames compiled, recompiles, graph breaks, from dynamo's records); and the git commit, torch
and transformers versions, GPU name, date. Per model (``models``): each variant's tokens/s
ratio to the default with CI95, the best peer and levers' best against it (``vs_best_peer``).
Writes ``OUT/summary.json`` after every row, merged with the rows already there by (model,
size, variant).
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
from levers.blocks import repeated_blocks  # noqa: E402
from levers.capture import compile_stats  # noqa: E402
from levers.environment import levers_commit_id  # noqa: E402
from levers.levers import load_all  # noqa: E402
from levers.levers.lever import NotApplicable  # noqa: E402
from levers.output.atomic import atomic_write_text  # noqa: E402
from levers.workloads import zoo  # noqa: E402
from levers_vs_peers import _bootstrap, _liger, measure  # noqa: E402

STACK = ("sdpa-attention", "compile-model")
VARIANTS = (
    "default", "compile-layers", "compile-model", "compile-model-ro", "liger",
    "lever:compile-blocks", "lever:compile-model", "levers-stack",
)
QUICK_VARIANTS = (
    "default", "compile-layers", "compile-model", "lever:compile-blocks", "lever:compile-model",
)
PEERS = ("compile-layers", "compile-model", "compile-model-ro", "liger")
QUICK_MAX_LAYERS = 6
STAGED = ("swin", "resnet", "convnext")  # their `layers` is the depth of a stage


def _graph_step(step: Callable[[], Any]) -> Callable[[], Any]:
    def graph_step() -> Any:
        torch.compiler.cudagraph_mark_step_begin()
        return step().clone()

    return graph_step


def _liger_supported(model: torch.nn.Module) -> str | None:
    """None when Liger Kernel has a patch for the model, else why not."""
    try:
        import liger_kernel.transformers as liger
    except Exception:  # noqa: BLE001 - absent or broken: the row says so
        return "liger-kernel is not installed"
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type is None or not hasattr(liger, f"apply_liger_kernel_to_{model_type}"):
        return f"Liger Kernel has no patch for {model_type or type(model).__name__}"
    return None


def apply_variant(workload, variant: str, options: dict[str, Any], row: dict[str, Any]):
    """Change the workload as the variant says; returns a cleanup (or None)."""
    if variant == "compile-layers":
        for block in repeated_blocks(workload.model):
            block.module.compile(**options)
    elif variant == "compile-model":
        workload.model.compile(**options)
    elif variant == "compile-model-ro":
        if workload.device.type != "cuda":
            raise LookupError("reduce-overhead (CUDA graphs) needs a GPU")
        workload.model.compile(mode="reduce-overhead", **options)
        workload.step = _graph_step(workload.step)
    elif variant == "liger":
        why = _liger_supported(workload.model)
        if why is not None:
            raise LookupError(why)
        return _liger(workload)
    elif variant.startswith("lever:") or variant == "levers-stack":
        ids = [variant[len("lever:"):]] if variant != "levers-stack" else list(STACK)
        handle = levers.apply(workload, ids, skip_inapplicable=len(ids) > 1, **options)
        row["applied"], row["skipped"] = handle.applied, handle.skipped
        for undo in handle._undos:  # compile-model's choice of mode, and why
            chosen = getattr(undo.__defaults__[0], "mode", None) if undo.__defaults__ else None
            if chosen is not None:
                row["compile_mode"] = chosen
                row["compile_mode_reasons"] = undo.__defaults__[0].reasons
        # the compile levers set a dynamo flag while on: the next row starts without it
        return handle.undo
    elif variant != "default":
        raise ValueError(f"unknown variant {variant}")
    return None


def build_params(model: str, args) -> dict[str, Any]:
    params: dict[str, Any] = {"model": model, "size": args.size, "device": args.device}
    depth = zoo.MODELS[model].sizes[args.size]["layers"]
    if args.quick and model not in STAGED and depth > QUICK_MAX_LAYERS:
        params["layers"] = QUICK_MAX_LAYERS
    return params


def run_row(model: str, variant: str, args, options: dict[str, Any]) -> dict[str, Any]:
    entry = zoo.MODELS[model]
    row: dict[str, Any] = {"model": model, "family": entry.family, "library": entry.library,
                           "size": args.size, "variant": variant}
    cleanup = None
    torch._dynamo.reset()
    before = compile_stats.snapshot()
    workload = None
    try:
        workload = zoo.build(**build_params(model, args))
        row["shape"] = " ".join(f"{k}={workload.params[k]}" for k in ("size", "batch_size", "layers"))
        row["batch_size"], row["layers"] = workload.params["batch_size"], workload.params["layers"]
        row["tokens_per_step"] = workload.tokens_per_step
        cleanup = apply_variant(workload, variant, options, row)
        row.update(measure(workload, args.warmup, args.steps))
        row["status"] = "ok"
    except (LookupError, NotApplicable) as exc:  # Liger has no patch; a lever says why not
        row["status"], row["error"] = "not-applicable", f"{type(exc).__name__}: {exc}"[:600]
    except Exception as exc:  # noqa: BLE001 - a failing variant is a result, not a crash
        row["status"] = "failed"
        row["error"] = f"{type(exc).__name__}: {exc}"[:600]
        if args.debug:
            traceback.print_exc()
    finally:
        row["compile"] = compile_summary(before)
        if cleanup is not None:
            cleanup()
        workload = None
        torch._dynamo.reset()
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return row


def compile_summary(before: Any) -> dict[str, Any]:
    """What torch.compile did since the ``compile_stats.snapshot()`` ``before``."""
    stats = compile_stats.since(before) or {}
    return {
        "frames_compiled": stats.get("frames_compiled", 0),
        "recompiles": sum(r["count"] for r in stats.get("recompiles", [])),
        "graph_breaks": sum(b["count"] for b in stats.get("graph_breaks", [])),
        "recompile_limit_hit": stats.get("recompile_limit_hit", False),
        "graph_break_reasons": sorted({b["reason"] for b in stats.get("graph_breaks", [])})[:5],
    }


def summarise(row: dict[str, Any], rng: random.Random) -> None:
    if row.get("status") != "ok":
        return
    durations, samples = row["dur_s"], row["tokens_per_s_samples"]
    row["step_ms"] = 1e3 * statistics.median(durations)
    row["step_ms_spread"] = [1e3 * min(durations), 1e3 * max(durations)]
    row["tokens_per_s"] = statistics.median(samples)
    row["tokens_per_s_spread"] = [min(samples), max(samples)]
    row["tokens_per_s_ci95"] = _bootstrap(samples, None, statistics.median, rng)
    peaks = row.get("peak_allocated_samples") or []
    row["peak_allocated_bytes"] = statistics.median(peaks) if peaks else None


def per_model(rows: list[dict[str, Any]], rng: random.Random) -> list[dict[str, Any]]:
    """Each model's variants against its default, the best peer and levers' best."""
    out = []
    ratio = lambda x, y: statistics.median(x) / statistics.median(y)  # noqa: E731
    for (model, size) in dict.fromkeys((r["model"], r["size"]) for r in rows):
        mine = {r["variant"]: r for r in rows if (r["model"], r["size"]) == (model, size)}
        base = mine.get("default")
        if base is None or base.get("status") != "ok":
            continue
        variants = {}
        for name, row in mine.items():
            if name == "default" or row.get("status") != "ok":
                continue
            if row.get("date") != base.get("date"):  # ratios only between rows of one run
                continue
            a, b = row["tokens_per_s_samples"], base["tokens_per_s_samples"]
            variants[name] = {"tokens_per_s_ratio": ratio(a, b),
                              "tokens_per_s_ratio_ci95": _bootstrap(a, b, ratio, rng)}
        peers = {n: v for n, v in variants.items() if n in PEERS}
        ours = {n: v for n, v in variants.items() if n not in PEERS}
        best_peer = max(peers, key=lambda n: peers[n]["tokens_per_s_ratio"], default=None)
        best_ours = max(ours, key=lambda n: ours[n]["tokens_per_s_ratio"], default=None)
        summary = {"model": model, "family": base["family"], "size": size, "shape": base["shape"],
                   "commit": base.get("commit"), "date": base.get("date"),
                   "default_tokens_per_s": base["tokens_per_s"], "variants": variants,
                   "best_peer": best_peer, "best_levers": best_ours, "vs_best_peer": None}
        if best_peer and best_ours:
            summary["vs_best_peer"] = (ours[best_ours]["tokens_per_s_ratio"]
                                       / peers[best_peer]["tokens_per_s_ratio"])
        out.append(summary)
    return out


def _merge(path: Path, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    key = lambda r: (r.get("model"), r.get("size"), r.get("variant"))  # noqa: E731
    if not path.exists():
        return rows
    old = json.loads(path.read_text(encoding="utf-8")).get("rows", [])
    redone = {key(r) for r in rows}
    return [r for r in old if key(r) not in redone] + rows


def write(out: Path, rows: list[dict[str, Any]], rng: random.Random) -> None:
    path = out / "summary.json"
    merged = _merge(path, rows)
    doc = {"rows": merged, "models": per_model(merged, rng), "command": " ".join(sys.argv)}
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(doc, indent=2) + "\n")


def parse_only(text: str | None, models: list[str], variants: tuple[str, ...]):
    """{model: None (its variants) or the set named}; refused before anything runs."""
    if not text:
        return {m: None for m in models}
    chosen: dict[str, set[str] | None] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        model, _, variant = part.partition(":")
        if model not in zoo.MODELS:
            raise SystemExit(f"--only {part}: unknown model {model!r}; models: {', '.join(zoo.MODELS)}")
        if model not in models:
            raise SystemExit(f"--only {part}: {zoo.MODELS[model].available()}")
        if variant and variant not in VARIANTS:
            raise SystemExit(f"--only {part}: unknown variant; variants: {', '.join(VARIANTS)}")
        if not variant:
            chosen[model] = None
        elif chosen.get(model, set()) is not None:
            chosen.setdefault(model, set()).add(variant)  # type: ignore[union-attr]
    return chosen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="directory of summary.json")
    parser.add_argument("--only", help="models or model:variant, comma-separated")
    parser.add_argument("--quick", action="store_true",
                        help=f"variants {', '.join(QUICK_VARIANTS)}; 2 + 8 steps; depth <= "
                        f"{QUICK_MAX_LAYERS}")
    parser.add_argument("--size", default="full", choices=zoo.spec.SIZES)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--steps", type=int, default=None, help="timed steps (default 20; quick 8)")
    parser.add_argument("--warmup", type=int, default=None, help="warm-up steps (default 3; quick 2)")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="start no row after this many seconds (default: none; quick 540)")
    parser.add_argument("--debug", action="store_true", help="print tracebacks of failing rows")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA GPU here; use --device cpu --size tiny")
    args.steps = args.steps or (8 if args.quick else 20)
    args.warmup = args.warmup or (2 if args.quick else 3)
    if args.budget_s is None and args.quick:
        args.budget_s = 540.0
    models = zoo.names(available_only=True)
    chosen = parse_only(args.only, models, VARIANTS)
    # on a CPU the compile rows trace with dynamo only: inductor's C++ compile would dominate
    options = {"backend": "eager"} if args.device == "cpu" else {}
    load_all()
    meta = {
        "commit": levers_commit_id() or "unknown",
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    import transformers

    meta["transformers"] = transformers.__version__
    rng = random.Random(0)
    rows: list[dict[str, Any]] = []
    started = time.perf_counter()
    for model in (m for m in models if m in chosen):
        wanted = chosen[model]
        names = [v for v in VARIANTS
                 if v == "default" or (v in wanted if wanted is not None
                                       else v in (QUICK_VARIANTS if args.quick else VARIANTS))]
        for variant in names:
            if args.budget_s is not None and time.perf_counter() - started > args.budget_s:
                print(f"budget of {args.budget_s:.0f}s spent: {model}:{variant} and after not run")
                write(args.out, rows, rng)
                return 0
            t0 = time.perf_counter()
            row = run_row(model, variant, args, options)
            row.update(meta)
            summarise(row, rng)
            rows.append(row)
            figure = (f"{row['tokens_per_s']:.0f} tok/s, {row['step_ms']:.1f} ms"
                      if row["status"] == "ok" else row.get("error", ""))
            print(f"{model}:{variant} {row['status']} in {time.perf_counter() - t0:.0f}s "
                  f"({figure}; compiled {row['compile']['frames_compiled']} frames, "
                  f"{row['compile']['recompiles']} recompiles, "
                  f"{row['compile']['graph_breaks']} breaks)", flush=True)
            write(args.out, rows, rng)
    print(f"wrote {args.out / 'summary.json'} in {time.perf_counter() - started:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
