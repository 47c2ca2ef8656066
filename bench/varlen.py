"""Benchmark: variable-length data, padded against packed, padding-free and padded to a multiple.

    # on the H200: hf llama 1b, 8 long-tailed sequences up to 4096 tokens per step
    PYTHONPATH=src python bench/varlen.py --out bench/results/levers_catalogue_varlen_h200
    # the CPU smoke run a test makes (tiny model, 2 steps, sdpa only)
    PYTHONPATH=src python bench/varlen.py --quick --out /tmp/varlen

The workload is ``hf`` (llama architecture) with ``lengths=longtail``: ``--batch-size``
sequences whose lengths are the quantiles of a log-normal with median ``seq_len / 8`` (mean at
most ``seq_len / 4``, the longest up to ``seq_len``), the same lengths every step, fresh tokens
each step, padded to the longest with an attention mask and labels -100 on the padding. Every
variant is built fresh from the same seed, so every variant trains on the same sequences.

A variant is ``LAYOUT@ATTN``: LAYOUT is ``padded`` (the workload as built), ``packing``,
``padding-free`` or ``pad-to-multiple`` (the levers of the same names), optionally with
``+compile`` (lever compile-blocks as well); ATTN is the transformers attention implementation
(``sdpa``, ``flex_attention``). FlexAttention has no backward on a CPU: those rows are skipped
there, and said so.

Per row: real tokens/s (real tokens only, never padding or packing filler) median, min, max,
p10 and p90 over the timed steps; step time; the loss per real token of every step (the model's
loss is the mean over real targets; the same steps in every variant, so equal within bf16
rounding across layouts); the tokens the model computed on per step (padding and filler
included); the peak allocated and reserved memory of the timed steps; the git commit, torch and
transformers versions, GPU and date. ``summary.json`` holds the rows and, per attention
implementation, compile setting and shape, each layout's real tokens/s against ``padded``;
``catalogue.json`` holds the lever rows ``levers list`` reads (ratio of medians, CI95 by a
bootstrap over steps) when OUT is
``bench/results/levers_catalogue_<name>``. Both are written atomically after every row, merged
with the rows an earlier call wrote there (so the compiled rows can be another call):

    PYTHONPATH=src python bench/varlen.py --variants padded+compile@sdpa,\
        pad-to-multiple+compile@sdpa,packing+compile@sdpa --out bench/results/levers_catalogue_varlen_h200

``--lengths varied`` (the measurable case of ``pad-to-multiple``) builds the workload with
``lengths=varied`` instead: fresh lengths every step from the same distribution, each batch
padded only to its own longest, so the padded width changes from step to step and a compiled
step meets new shapes. Every step is then timed alone, the warm-up ones too (the memory peaks
are over all of them), and a row records
each step's lengths, real tokens, the ``input_ids`` shape the model got and the graphs dynamo
compiled in it (``torch._dynamo.utils.counters["stats"]["unique_graphs"]``); the number of
distinct widths and of compiled graphs; ``all_steps_s``, the wall time of all steps, compiles
included; ``compile_steps_s``, the time of the steps that compiled; and real tokens/s over the
steady steps (those past the warm-up that compiled nothing, never the first), each step's own
real tokens over its own time. Dynamo's recompile limit is raised to the row's steps plus
:data:`RECOMPILE_ROOM` so that no width sends the blocks to eager silently; the row's ``dynamo``
says what was used, and whether dynamo makes a dimension that changed dynamic (its default: a
width change then costs one recompile to a dynamic program, not one per width; with
``--static-widths`` it does not, and every new width compiles a program of its own, the regime
``pad-to-multiple`` is for; the rows' shape then ends in ``widths=static``). The comparisons
add the widths, graphs and all-steps time of both sides and the all-steps speed-up; the
catalogue row's ratio is the steady one, with the rest in its note:

    PYTHONPATH=src python bench/varlen.py --lengths varied --steps 30 --warmup 0 \
        --variants padded+compile@sdpa,pad-to-multiple+compile@sdpa,\
packing+compile@sdpa,padded@sdpa --out bench/results/levers_catalogue_varlen_varied_h200
    # the CPU smoke run a test makes (compile-blocks on dynamo's eager backend)
    PYTHONPATH=src python bench/varlen.py --quick --lengths varied --compile-backend eager \
        --variants padded@sdpa,pad-to-multiple@sdpa,packing@sdpa,padded+compile@sdpa,\
pad-to-multiple+compile@sdpa --out /tmp/varied
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import math
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

import levers  # noqa: E402
from levers.batches import draw_padded, varied_lengths  # noqa: E402
from levers.environment import levers_commit_id  # noqa: E402
from levers.output.atomic import atomic_write_text  # noqa: E402
from levers.workloads import hf  # noqa: E402

LAYOUTS = ("padded", "packing", "padding-free", "pad-to-multiple")
DEFAULT_VARIANTS = (
    "padded@sdpa", "packing@sdpa", "padding-free@sdpa",
    "padded@flex_attention", "packing@flex_attention", "padding-free@flex_attention",
)
QUICK_VARIANTS = ("padded@sdpa", "packing@sdpa", "padding-free@sdpa", "pad-to-multiple@sdpa")
GOAL_RATIO = 2.0  # packing's real tokens/s over padded's, the goal
RESAMPLES = 2000
# with lengths=varied: dynamo's recompile limit is raised to the row's steps plus this, room for
# a program per step (a new width each) beside compile-blocks' one per kind of block
RECOMPILE_ROOM = 64


def parse_variant(text: str) -> tuple[str, bool, str]:
    """``"packing+compile@sdpa"`` -> ``("packing", True, "sdpa")``."""
    layout, _, attn = text.partition("@")
    layout, plus, extra = layout.partition("+")
    if layout not in LAYOUTS or (plus and extra != "compile") or not attn:
        raise ValueError(
            f"variant {text!r} is not LAYOUT[+compile]@ATTN with LAYOUT one of "
            f"{', '.join(LAYOUTS)} (e.g. packing@sdpa, pad-to-multiple+compile@sdpa)"
        )
    return layout, bool(plus), attn


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # sync point: the step's end, for its wall time


def _spread(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return {"median": statistics.median(values), "min": ordered[0], "max": ordered[-1],
            "p10": at(0.1), "p90": at(0.9)}


def laid_out_tokens(workload: Any) -> int:
    """Tokens the model computes on per step after the data levers (padding and filler
    included), from a batch drawn on a generator of its own (the step's stream is untouched)."""
    batches = workload.step.batches
    generator = torch.Generator(device=workload.device).manual_seed(12345)
    vocab = workload.model.config.vocab_size
    batch = draw_padded(batches.lengths, vocab, generator)
    for _, transform in batches.transforms:
        batch = transform(batch)
    return int(batch["input_ids"].numel())


def run_row(variant: str, args: argparse.Namespace, meta: dict[str, Any]) -> dict[str, Any]:
    layout, compiled, attn = parse_variant(variant)
    static = args.static_widths and args.lengths == "varied"
    params = {"arch": "llama", "size": args.size, "device": args.device, "seed": args.seed,
              "batch_size": args.batch_size, "seq_len": args.seq_len, "lengths": args.lengths,
              "attn": attn}
    row: dict[str, Any] = {"variant": variant, "layout": layout, "attn": attn,
                           "compiled": compiled, "workload": "hf",
                           "shape": " ".join(f"{k}={v}" for k, v in params.items()
                                             if k not in ("device", "seed"))
                           + (" widths=static" if static else ""),
                           **meta}
    if attn == "flex_attention" and args.device == "cpu":
        return {**row, "status": "skipped",
                "error": "FlexAttention has no backward on a CPU (torch raises); run on a GPU"}
    torch._dynamo.reset()
    device = torch.device(args.device)
    undo_dynamo = lambda: None  # noqa: E731
    undo_levers = lambda: None  # noqa: E731
    try:
        if args.lengths == "varied":
            undo_dynamo = _dynamo_for_varied(args.warmup + args.steps + RECOMPILE_ROOM,
                                             static=static)
        workload = hf.build(**params)
        ids = [layout] if layout != "padded" else []
        if compiled:
            ids.append("compile-blocks" + (f":backend={args.compile_backend}"
                                           if args.compile_backend else ""))
        if ids:
            # undone after the row: compile-blocks raises dynamo's recompile limit and may trace
            # int attributes unspecialised, process-wide, for as long as it is on
            undo_levers = levers.apply(workload, ",".join(ids)).undo
        row["levers"] = [i.split(":")[0] for i in ids]
        if args.lengths == "varied":
            row["dynamo"] = _dynamo_settings()
        if compiled and args.compile_backend:
            row["compile_backend"] = args.compile_backend
        if args.lengths == "varied":
            row.update(time_varied(workload, args, device))
        else:
            row.update(time_longtail(workload, args, device))
    except Exception as exc:  # noqa: BLE001 - a failed row is written, with why
        row.update({"status": "failed", "error": f"{type(exc).__name__}: {exc}",
                    "traceback": traceback.format_exc(limit=6)})
    finally:
        undo_levers()
        workload = None  # noqa: F841 - free the model before the next row
        undo_dynamo()
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return row


def _peaks(device: torch.device) -> dict[str, Any]:
    on_cuda = device.type == "cuda"
    return {"peak_allocated_bytes": torch.cuda.max_memory_allocated(device) if on_cuda else None,
            "peak_reserved_bytes": torch.cuda.max_memory_reserved(device) if on_cuda else None}


def time_longtail(workload: Any, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """The same lengths every step: warm-up steps untimed, then each timed step alone."""
    out: dict[str, Any] = {"lengths": list(workload.step.batches.lengths),
                           "real_tokens_per_step": workload.tokens_per_step,
                           "computed_tokens_per_step": laid_out_tokens(workload)}
    losses, durations = [], []
    warmup_s = time.perf_counter()
    for _ in range(args.warmup):
        losses.append(float(workload.step()))  # sync point: the loss of every step is kept
    _sync(device)
    out["warmup_s"] = time.perf_counter() - warmup_s
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    for _ in range(args.steps):
        _sync(device)
        start = time.perf_counter()
        loss = workload.step()
        _sync(device)
        durations.append(time.perf_counter() - start)
        losses.append(float(loss))  # sync point: after the timed region
    rates = [workload.tokens_per_step / d for d in durations]
    return {**out, "status": "ok", "steps": args.steps, "warmup": args.warmup,
            "real_tokens_per_s": _spread(rates), "real_tokens_per_s_samples": rates,
            "step_ms": _spread([d * 1e3 for d in durations]), "loss_per_real_token": losses,
            **_peaks(device)}


def time_varied(workload: Any, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """Fresh lengths every step: every step timed alone, warm-up included, with the shape the
    model got and the graphs dynamo compiled in it. A step that compiled nothing, past the
    warm-up and never the first (cold for every variant), is steady; real tokens/s is read over
    those, each step's own real tokens over its own time."""
    num_steps = args.warmup + args.steps
    lengths = [varied_lengths(args.batch_size, args.seq_len, seed=args.seed, step=k)
               for k in range(num_steps)]  # the workload's k-th batch (hf.varied_draw)
    shapes: list[tuple[int, ...]] = []
    hook = workload.model.register_forward_pre_hook(
        lambda module, a, kw: shapes.append(tuple(kw["input_ids"].shape)), with_kwargs=True)
    graphs = torch._dynamo.utils.counters["stats"]
    losses, durations, compiled_graphs = [], [], []
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    try:
        for _ in range(num_steps):
            before = graphs["unique_graphs"]
            _sync(device)
            start = time.perf_counter()
            loss = workload.step()
            _sync(device)
            durations.append(time.perf_counter() - start)
            compiled_graphs.append(graphs["unique_graphs"] - before)
            losses.append(float(loss))  # sync point: after the timed region
    finally:
        hook.remove()
    assert len(shapes) == num_steps, "one forward per step"
    real = [sum(n) for n in lengths]
    steady = [k for k in range(max(1, args.warmup), num_steps) if compiled_graphs[k] == 0]
    compile_steps = [k for k in range(num_steps) if compiled_graphs[k]]
    rates = [real[k] / durations[k] for k in steady]
    return {
        "status": "ok",  # without a steady step, the all-steps figures still stand
        "steps": args.steps, "warmup": args.warmup,
        "lengths_of_steps": [list(n) for n in lengths],
        "real_tokens_of_steps": real,
        "expected_real_tokens_per_step": workload.tokens_per_step,
        "input_shapes_of_steps": [list(s) for s in shapes],
        "num_distinct_widths": len({s[-1] for s in shapes}),
        "num_distinct_shapes": len(set(shapes)),
        "computed_tokens_of_steps": [math.prod(s) for s in shapes],
        "step_s_of_steps": durations,
        "compiled_graphs_of_steps": compiled_graphs,
        "compiled_graphs": sum(compiled_graphs),
        "compile_steps": compile_steps,
        "compile_steps_s": sum(durations[k] for k in compile_steps),
        "all_steps_s": sum(durations),
        "all_steps_real_tokens_per_s": sum(real) / sum(durations),
        "steady_steps": steady,
        "real_tokens_per_s": _spread(rates) if rates else None,
        "real_tokens_per_s_samples": rates,
        "step_ms": _spread([durations[k] * 1e3 for k in steady]) if steady else None,
        "loss_per_real_token": losses,
        **_peaks(device),
    }


def _dynamo_for_varied(limit: int, *, static: bool) -> Any:
    """Raise dynamo's recompile limit to ``limit`` for the row, so that a program per padded
    width never sends the blocks past the limit to eager, silently; with ``static``, turn off
    its automatic dynamic shapes, so that every new width compiles a program of its own.
    Returns the undo."""
    config, name = torch._dynamo.config, _limit_name()
    previous = getattr(config, name), config.automatic_dynamic_shapes
    setattr(config, name, max(previous[0], limit))
    if static:
        config.automatic_dynamic_shapes = False

    def undo() -> None:
        setattr(config, name, previous[0])
        config.automatic_dynamic_shapes = previous[1]

    return undo


def _limit_name() -> str:
    config = torch._dynamo.config
    return "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"


def _dynamo_settings() -> dict[str, Any]:
    """What decides whether a new width recompiles and whether a recompile is allowed: the
    limits as the row ran (after the levers, which may raise them), and whether dynamo turns a
    dimension that changed into a dynamic one (then a width change costs one recompile, not one
    per width)."""
    config = torch._dynamo.config
    return {_limit_name(): getattr(config, _limit_name()),
            "accumulated_recompile_limit": getattr(config, "accumulated_recompile_limit", None),
            "automatic_dynamic_shapes": config.automatic_dynamic_shapes}


def _bootstrap_ratio(a: list[float], b: list[float], rng: random.Random) -> tuple[float, float]:
    """CI95 of median(b) / median(a), resampling each side's steps."""
    ratios = sorted(
        statistics.median(rng.choices(b, k=len(b))) / statistics.median(rng.choices(a, k=len(a)))
        for _ in range(RESAMPLES)
    )
    return ratios[int(0.025 * RESAMPLES)], ratios[int(0.975 * RESAMPLES) - 1]


def comparisons(rows: list[dict[str, Any]], seed: int) -> tuple[list[dict], list[dict]]:
    """(summary comparisons, catalogue rows): each layout against padded at the same attention
    implementation, compile setting and shape (lengths included)."""
    rng = random.Random(seed)
    ok = {(r["layout"], r["compiled"], r["attn"], r["shape"]): r
          for r in rows if r.get("status") == "ok"}
    summary, catalogue = [], []
    for row in rows:
        if row["layout"] == "padded" or row.get("status") == "skipped":
            continue
        base = ok.get(("padded", row["compiled"], row["attn"], row["shape"]))
        if base is None:
            continue
        entry: dict[str, Any] = {"variant": row["variant"], "baseline": base["variant"]}
        lever = {"lever": row["layout"], "levers": row.get("levers", [row["layout"]]),
                 "workload": "hf", "shape": row["shape"], "baseline": base["variant"],
                 "gpu": row["gpu"], "torch": row["torch"], "commit": row["commit"],
                 "date": row["date"]}
        if row.get("status") != "ok":
            catalogue.append({**lever, "status": "failed", "error": row.get("error"),
                              "tokens_per_s_ratio": None, "tokens_per_s_ratio_ci95": None})
            summary.append({**entry, "status": "failed"})
            continue
        a, b = base["real_tokens_per_s_samples"], row["real_tokens_per_s_samples"]
        ratio = ci95 = None  # lengths=varied with every timed step compiling: no steady ratio
        if a and b:
            ratio = statistics.median(b) / statistics.median(a)
            ci95 = _bootstrap_ratio(a, b, rng) if min(len(a), len(b)) > 1 else (ratio, ratio)
        loss_diff = max(abs(x - y) for x, y in zip(base["loss_per_real_token"],
                                                   row["loss_per_real_token"]))
        peak = None
        if row.get("peak_allocated_bytes") is not None and base.get("peak_allocated_bytes"):
            peak = float(row["peak_allocated_bytes"] - base["peak_allocated_bytes"])
        entry.update({"status": "ok", "real_tokens_per_s_ratio": ratio,
                      "real_tokens_per_s_ratio_ci95": list(ci95) if ci95 else None,
                      "max_loss_difference": loss_diff, "peak_allocated_delta_bytes": peak})
        note = None
        if "all_steps_s" in row:  # lengths=varied: what the widths cost, compiles included
            entry.update({key: {"baseline": base[key], "variant": row[key]}
                          for key in ("num_distinct_widths", "compiled_graphs", "all_steps_s")})
            entry["all_steps_speedup"] = base["all_steps_s"] / row["all_steps_s"]
            steady = ("ratio over the steady steps (none compiled in)" if ratio is not None
                      else "no steady ratio: every timed step of one side compiled")
            note = (f"lengths drawn afresh each step; {steady}; "
                    f"{row['num_distinct_widths']} distinct widths against "
                    f"{base['num_distinct_widths']}, {row['compiled_graphs']} graphs compiled "
                    f"against {base['compiled_graphs']}, all {len(row['step_s_of_steps'])} steps "
                    f"{row['all_steps_s']:.1f} s against {base['all_steps_s']:.1f} s")
        if row["layout"] == "packing" and ratio is not None:
            entry["goal"] = f"packing >= {GOAL_RATIO}x padded real tokens/s: " + (
                "met" if ratio >= GOAL_RATIO else "not met")
        summary.append(entry)
        catalogue.append({**lever, "status": "ok", "tokens_per_s_ratio": ratio,
                          "tokens_per_s_ratio_ci95": list(ci95) if ci95 else None,
                          "peak_allocated_delta_bytes": peak, "peak_reserved_delta_bytes": None,
                          "peak_allocated_delta_ci95": None, "error": None,
                          **({"note": note} if note else {})})
    return summary, catalogue


def earlier_rows(out: Path) -> list[dict[str, Any]]:
    """The rows an earlier run wrote to ``out`` (another call with other variants)."""
    path = out / "summary.json"
    return json.loads(path.read_text())["rows"] if path.exists() else []


def write(out: Path, rows: list[dict[str, Any]], meta: dict[str, Any], seed: int) -> None:
    """Write the summary and the catalogue, merged with the rows already in ``out`` (a row of
    this run replaces an earlier one of the same variant and shape)."""
    out.mkdir(parents=True, exist_ok=True)
    mine = {(r["variant"], r["shape"]) for r in rows}
    rows = [r for r in earlier_rows(out) if (r["variant"], r["shape"]) not in mine] + rows
    summary, catalogue = comparisons(rows, seed)
    atomic_write_text(out / "summary.json", json.dumps(
        {"meta": meta, "rows": rows, "comparisons": summary}, indent=2) + "\n")
    atomic_write_text(out / "catalogue.json", json.dumps(
        {"gpu": meta["gpu"], "torch": meta["torch"], "commit": meta["commit"],
         "date": meta["date"], "rows": catalogue}, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--size", default="1b")
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--variants", default=None,
                        help="comma-separated LAYOUT[+compile]@ATTN (default: "
                        + ",".join(DEFAULT_VARIANTS) + ")")
    parser.add_argument("--lengths", choices=("longtail", "varied"), default="longtail",
                        help="the hf workload's lengths: longtail (the same every step) or varied "
                        "(drawn afresh each step, padded to each step's longest)")
    parser.add_argument("--static-widths", action="store_true",
                        help="with --lengths varied: dynamo's automatic dynamic shapes off, so "
                        "every new width recompiles (the regime pad-to-multiple is for)")
    parser.add_argument("--compile-backend", default=None,
                        help="compile-blocks' backend for +compile variants (default its own, "
                        "inductor; aot_eager or eager for a quick CPU run)")
    parser.add_argument("--quick", action="store_true",
                        help="CPU smoke run: tiny model, seq 128, 8 sequences, 1 warm-up and 2 "
                        "timed steps, sdpa layouts")
    args = parser.parse_args(argv)
    variants = DEFAULT_VARIANTS
    if args.quick:
        args.size, args.seq_len, args.batch_size = "tiny", 128, 8
        args.steps, args.warmup, args.device = 2, 1, "cpu"
        variants = QUICK_VARIANTS
    if args.variants:
        variants = tuple(v.strip() for v in args.variants.split(",") if v.strip())
    for variant in variants:
        parse_variant(variant)  # refuse a bad name before anything runs
    import transformers

    meta = {
        "commit": levers_commit_id() or "unknown",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "gpu": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": "python bench/varlen.py " + " ".join(argv if argv is not None else sys.argv[1:]),
    }
    rows: list[dict[str, Any]] = []
    for variant in variants:
        row = run_row(variant, args, meta)
        rows.append(row)
        rate = (row.get("real_tokens_per_s") or {}).get("median")
        varied = (f"; {row['num_distinct_widths']} widths, {row['compiled_graphs']} graphs "
                  f"compiled, all {len(row['step_s_of_steps'])} steps {row['all_steps_s']:.1f} s"
                  if "all_steps_s" in row else "")
        print(f"{variant}: {row['status']}" + (f", {rate:,.0f} real tokens/s" if rate else "")
              + varied + (f" ({row['error']})" if row.get("error") else ""), flush=True)
        write(args.out, rows, meta, args.seed)
    for entry in comparisons(rows, args.seed)[0]:
        if entry["status"] == "ok":
            steady = "no steady step on one side"
            if entry["real_tokens_per_s_ratio"] is not None:
                low, high = entry["real_tokens_per_s_ratio_ci95"]
                steady = (f"{entry['real_tokens_per_s_ratio']:.2f}x real tokens/s "
                          f"[{low:.2f}, {high:.2f}]")
            print(f"{entry['variant']} vs {entry['baseline']}: {steady}"
                  f", loss differs by at most {entry['max_loss_difference']:.2e}"
                  + (f"; all steps {entry['all_steps_speedup']:.2f}x as fast, compiles included"
                     if "all_steps_speedup" in entry else "")
                  + (f"; {entry['goal']}" if "goal" in entry else ""))
    return 0 if all(r["status"] in ("ok", "skipped") for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
