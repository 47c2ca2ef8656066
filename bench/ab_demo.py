"""Benchmark: `levers ab demo --set-b fixed=all` and repeated A/A runs (the noise floor).

    PYTHONPATH=src python bench/ab_demo.py --device cuda --size 1b --out bench/results/ab_demo_h200
    PYTHONPATH=src python bench/ab_demo.py --device cpu --size tiny --out bench/results/ab_demo_cpu

Each comparison runs through the real command line against a pre-registration written into
OUT the first time (`fixed_all.toml`, `aa.toml`); every run appends its full result (every
sample, CIs, environment, commit) to the record beside it (`*.toml.record.jsonl`), so running
the benchmark again adds lines and overwrites nothing. `fixed_all.md` is the pull-request view
of the last fixed=all run (`fixed_all.json` its whole result) and `summary.md` tabulates every
run in both records, with the A/A CI widths as the noise floor.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from levers.ab.prereg import template
from levers.ab.record import read_record
from levers.output.atomic import atomic_write_text
from levers.cli import main as levers_main

FIXED_ALL_EXPECTATIONS = [
    {
        "id": 1,
        "read": "parity",
        "direction": "same",
        "size": 0.0,
        "confidence": "high",
        "text": "All eight demo fixes together pass the parity gate (some change rounding).",
    },
    {
        "id": 2,
        "read": "step_time",
        "direction": "lower",
        "size": 0.0,
        "confidence": "medium-high",
        "text": "On a GPU the fixed step is faster (cuDNN suffix attention, SDPA ViT, fused norm, "
        "no syncs) despite checkpointing's recompute. On a CPU: open.",
    },
    {
        "id": 3,
        "read": "peak_allocated",
        "direction": "lower",
        "size": 0.05,
        "confidence": "high",
        "text": "Activation checkpointing and the valid-row loss cut peak allocated by over 5%.",
    },
    {
        "id": 4,
        "read": "tokens_per_s",
        "direction": "higher",
        "size": 0.0,
        "confidence": "medium",
        "text": "Tokens/s rise with the step time drop (same tokens per step).",
    },
]
AA_EXPECTATIONS = [
    {
        "id": 1,
        "read": "parity",
        "direction": "same",
        "size": 0.0,
        "confidence": "high",
        "text": "The same workload on both sides passes parity.",
    },
    {
        "id": 2,
        "read": "step_time",
        "direction": "same",
        "size": 0.05,
        "confidence": "high",
        "text": "A/A step-time CI95 lies within 5% of no change.",
    },
    {
        "id": 3,
        "read": "tokens_per_s",
        "direction": "same",
        "size": 0.05,
        "confidence": "high",
        "text": "A/A tokens/s CI95 lies within 5% of no change.",
    },
    {
        "id": 4,
        "read": "peak_allocated",
        "direction": "same",
        "size": 0.0,
        "confidence": "high",
        "text": "A/A peak allocated is identical (GPU only; not measured on a CPU).",
    },
]


def _prereg(path: Path, design: dict, question: str, expectations: list, rule: str) -> None:
    if path.exists():  # frozen by an earlier run: reuse it as it is
        return
    atomic_write_text(
        path,
        template(design, question=question, expectations=expectations, decision_rule=rule),
        exclusive=True,
        make_parents=True,
    )


def _summary_rows(events: list[dict]) -> list[str]:
    rows = []
    results = [e for e in events if e.get("event") == "result"]
    for n, event in enumerate(results, start=1):
        killed = event["killed"]
        status = f"KILLED: {killed['reason']}" if killed else event["decision"]
        load = event["environment"].get("load_average_1_5_15m")
        status += f" (load {load[0]:.1f})" if load else ""
        for read in event["reads"]:
            ci = read["ci"]
            ratio = f"{ci['ratio']:.4f} [{ci['lo']:.4f}, {ci['hi']:.4f}]" if ci else "n/a"
            width = f"{(ci['hi'] - ci['lo']) * 100:.2f}%" if ci else "n/a"
            base = read["baseline"]["median"] if read["baseline"] else None
            cand = read["candidate"]["median"] if read["candidate"] else None
            rows.append(
                f"| {n} | {read['name']} | {_fmt(base, read['unit'])} | {_fmt(cand, read['unit'])}"
                f" | {ratio} | {width} | {read['verdict']} | {status} |"
            )
    return rows


def _fmt(value, unit: str) -> str:
    if value is None:
        return "n/a"
    if unit == "bytes":
        return f"{value / 1024**3:.3f} GiB"
    if unit == "ms":
        return f"{value:.3f} ms"
    return f"{value:,.0f}"


def _environment(events: list[dict]) -> str:
    results = [e for e in events if e.get("event") == "result"]
    if not results:
        return "no results"
    env = results[-1]["environment"]
    gpu = env.get("gpu")
    hardware = f"{gpu['name']}, driver {gpu['driver']}, CUDA {gpu['cuda']}" if gpu else env["cpu"]
    commit = env.get("levers_commit") or {}
    if isinstance(commit, str):  # records since one environment record: the id, dirty beside it
        commit = {"commit": commit, "dirty": env.get("levers_commit_dirty")}
    return (
        f"{hardware}; torch {env['torch']}; {env['num_threads']} CPU threads; load average "
        f"(1/5/15 min) {env.get('load_average_1_5_15m')} at the end of the last run; levers "
        f"commit {commit.get('commit', 'unknown')[:12]}{' (dirty)' if commit.get('dirty') else ''}"
    )


def write_summary(out: Path, command: str) -> str:
    header = (
        "| run | read | baseline median | candidate median | ratio [CI95] | CI width "
        "| verdict | run decision (1-min load average at its end) |"
    )
    lines = [f"# levers ab demo benchmark\n\nCommand: `{command}`\n"]
    for name, title in (("fixed_all", "demo, fixed=all vs none"), ("aa", "A/A (noise floor)")):
        events = read_record(out / f"{name}.toml.record.jsonl")
        lines += [
            f"## {title}\n",
            f"Environment: {_environment(events)}\n",
            header,
            "| --- " * 8 + "|",
            *_summary_rows(events),
            "",
        ]
    text = "\n".join(lines)
    atomic_write_text(out / "summary.md", text, make_parents=True)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--size", default="tiny")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--aa-repeats", type=int, default=3)
    parser.add_argument(
        "--time-budget-s", type=float, default=None, help="kill line for each comparison"
    )
    parser.add_argument("--skip-fixed", action="store_true", help="only the A/A runs")
    parser.add_argument(
        "--deadline-s",
        type=float,
        default=None,
        help="start no comparison that the longest one so far would carry past "
        "this many seconds from the start",
    )
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    design = {
        "baseline": "demo",
        "params": {"device": args.device, "size": args.size},
        "steps": args.steps,
        "warmup": args.warmup,
        "time_budget_s": args.time_budget_s,
    }
    fixed_all, aa = args.out / "fixed_all.toml", args.out / "aa.toml"
    _prereg(
        fixed_all,
        {**design, "params_b": {"fixed": "all"}},
        f"Do the demo's eight fixes together make its step faster and smaller on "
        f"{args.device} at size {args.size}, without changing the math beyond rounding?",
        FIXED_ALL_EXPECTATIONS,
        "parity PARITY and step_time IMPROVED => the fixes pay on this device.\n"
        "parity DAMAGED => a fix changed the math: find it before anything else.",
    )
    _prereg(
        aa,
        design,
        f"How wide are A/A CIs (the noise floor) on {args.device} at size {args.size}?",
        AA_EXPECTATIONS,
        "PARITY on every read => the CI widths are the noise floor to quote.",
    )
    runs = (
        []
        if args.skip_fixed
        else [
            [
                "ab",
                "--prereg",
                str(fixed_all),
                "--md",
                str(args.out / "fixed_all.md"),
                "--json",
                str(args.out / "fixed_all.json"),
            ]
        ]
    )
    runs += [["ab", "--prereg", str(aa)]] * args.aa_repeats
    codes: list[int] = []
    started_s, longest_s = time.perf_counter(), 0.0
    for argv_ab in runs:
        elapsed_s = time.perf_counter() - started_s
        if args.deadline_s is not None and elapsed_s + longest_s > args.deadline_s:
            print(f"deadline: skipped {len(runs) - len(codes)} comparison(s) at {elapsed_s:.0f} s")
            break
        codes.append(levers_main(argv_ab))
        longest_s = max(longest_s, time.perf_counter() - started_s - elapsed_s)
    command = "python bench/ab_demo.py " + " ".join(sys.argv[1:] if argv is None else argv)
    print(write_summary(args.out, command))
    return max(codes) if codes else 0


if __name__ == "__main__":
    sys.exit(main())
