"""levers' commands, as a user runs them, on architectures beyond the zoo (issue 33): for each
architecture of ``bench/arch_sweep.py``'s list (transformers' four auto mappings and timm's
registry, one per module), ``levers audit``, ``levers memory --gpu h200`` and ``levers tune
--budget 60`` on the ``arch`` workload at ``size=tiny`` on this CPU, each in its own process with
a timeout. On a CPU tune leaves out the levers whose speed-up exists only on a GPU (with that
reason) and A/Bs the rest: what it tries here is its search's own path on a model it was not
built on (the catalogue's regimes, each lever's applies, parity and the A/Bs), not a speed-up.

    OMP_NUM_THREADS=1 python bench/arch_commands.py --sample 120 --seed 1 \\
        --out bench/results/arch_commands_cpu
    # levers memory at the shapes as shipped (the GPU sweep's), on fake tensors
    python bench/arch_commands.py --size full --commands memory --out bench/results/arch_commands_full_cpu ...
    # one command on the architectures already run (the other commands' rows are kept)
    python bench/arch_commands.py --sample 429 --seed 1 --commands tune --resume ...

A command's outcome is ``ok`` (exit 0), ``refused`` (exit 2 or 3: levers' own error, a message
that says what to do, no traceback) or ``crash`` (any other exit, or a traceback from inside
levers): a crash on a model levers was never built on is a bug. Each row keeps what the command
found (the audit's bottleneck and finding codes, the memory plan's predicted peak) and the last
lines of its error output.

Writes ``OUT/results.jsonl`` (one row per architecture and command; rows of an architecture run
again replace its rows) and ``OUT/summary.md``.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
os.environ.setdefault("LEVERS_TORCHVISION_WITHOUT_OPS", "1")  # see bench/arch_sweep.py

from levers.output.atomic import atomic_write_text  # noqa: E402

COMMANDS = ("audit", "memory", "tune")
TIMEOUT_S = 300
MEMORY_GPU = "h200"
TUNE_BUDGET = "60"


def _arch_sweep() -> Any:
    spec = importlib.util.spec_from_file_location("bench_arch_sweep", ROOT / "bench/arch_sweep.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def arguments(name: str, size: str = "tiny") -> list[str]:
    """The ``--set`` pairs of ``arch`` for ``model/task`` (``timm:x`` has no task) at ``size``."""
    model, _, task = name.partition("/")
    pairs = [f"model={model}"] + ([f"task={task}"] if task else []) + [f"size={size}"]
    return ["--set", *pairs]


def command_line(command: str, name: str, json_path: Path, size: str = "tiny") -> list[str]:
    line = [sys.executable, "-m", "levers.cli.command", command, "arch",
            *arguments(name, size)]
    if command == "audit":
        return line + ["--findings-json", str(json_path)]
    if command == "tune":
        return line + ["--budget", TUNE_BUDGET, "--json", str(json_path)]
    return line + ["--gpu", MEMORY_GPU, "--json", str(json_path)]


def _tail(text: str, lines: int = 3) -> str:
    kept = [line for line in (text or "").splitlines() if line.strip()]
    return " | ".join(kept[-lines:])[-600:]


def found(command: str, report: dict[str, Any]) -> dict[str, Any]:
    """What a command's JSON says, in a few fields."""
    if command == "audit":
        return {
            "bound": (report.get("bottleneck") or {}).get("bound"),
            "codes": sorted({f.get("code") for f in report.get("findings") or []}),
            "stack": (report.get("recommendation") or {}).get("levers"),
        }
    if command == "tune":
        return {"stack": report.get("stack"), "nothing_tried": report.get("nothing_tried"),
                "trials": len(report.get("trials") or []),
                "tried": sorted({",".join(t.get("stack") or ()) for t in report.get("trials") or []}),
                "parity": sorted({t.get("parity") or "" for t in report.get("trials") or []}),
                # why each lever not A/B'd was left out (the first line of its reason)
                "left_out": {o["lever"]: (o.get("reason") or "")[:160]
                             for o in report.get("outcomes") or [] if o.get("trial") is None}}
    return {"peak_allocated_bytes": report.get("peak_allocated_bytes"),
            "peak_reserved_bytes": report.get("peak_reserved_bytes"),
            "peak_module": (report.get("peak") or {}).get("module")}


def run_command(command: str, name: str, timeout_s: float, size: str = "tiny") -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        json_path = Path(tmp) / "out.json"
        started = time.perf_counter()
        process = subprocess.Popen(
            command_line(command, name, json_path, size), stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, start_new_session=True, cwd=tmp,
            env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"},
        )
        try:
            stdout, stderr = process.communicate(timeout=timeout_s)
            rc: int | None = process.returncode
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            stdout, stderr = process.communicate()
            rc = None
        row: dict[str, Any] = {"arch": name, "command": command, "size": size, "rc": rc,
                               "seconds": round(time.perf_counter() - started, 2)}
        traceback_shown = "Traceback (most recent call last)" in (stderr or "")
        if rc == 0 and not traceback_shown:
            row["outcome"] = "ok"
        elif rc in (2, 3) and not traceback_shown:
            row["outcome"] = "refused"
        elif rc is None:
            row["outcome"] = "timeout"
        else:
            row["outcome"] = "crash"
        if row["outcome"] != "ok":
            row["error"] = _tail(stderr or stdout)
        if json_path.exists():
            try:
                row.update(found(command, json.loads(json_path.read_text(encoding="utf-8"))))
            except (ValueError, AttributeError) as exc:
                row["json_error"] = repr(exc)[:200]
    return row


def summary(rows: list[dict[str, Any]], header: dict[str, Any]) -> str:
    archs = sorted({r["arch"] for r in rows})
    sizes = ", ".join(sorted({r.get("size", "tiny") for r in rows}))
    lines = [f"# levers' commands on architectures beyond the zoo (CPU, size={sizes})", "",
             f"{len(archs)} architectures; {header}", "",
             "| command | ok | refused | crash | timeout | median s |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for command in COMMANDS:
        mine = [r for r in rows if r["command"] == command]
        if not mine:
            continue
        count = collections.Counter(r["outcome"] for r in mine)
        times = sorted(r["seconds"] for r in mine if r["outcome"] == "ok")
        median = f"{times[len(times) // 2]:.1f}" if times else ""
        lines.append(f"| {command} | {count['ok']} | {count['refused']} | {count['crash']} | "
                     f"{count['timeout']} | {median} |")
    for outcome in ("crash", "timeout", "refused"):
        bad = [r for r in rows if r["outcome"] == outcome]
        if bad:
            lines += ["", f"## {outcome}", ""]
            lines += [f"- `{r['arch']}` {r['command']}: {r.get('error', '')[:400]}" for r in bad]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/arch_commands_cpu")
    parser.add_argument("--library", choices=("transformers", "timm", "all"), default="all")
    parser.add_argument("--only", help="architectures, comma-separated")
    parser.add_argument("--sample", type=int, help="a seeded random sample of this many")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--timeout-s", type=float, default=TIMEOUT_S, help="per command")
    parser.add_argument("--size", choices=("tiny", "full"), default="tiny",
                        help="arch's size: full is the shape as shipped (levers memory predicts "
                             "it on fake tensors; audit and tune build it on this CPU)")
    parser.add_argument("--commands", default=",".join(COMMANDS),
                        help=f"comma-separated, of {', '.join(COMMANDS)}")
    parser.add_argument("--resume", action="store_true",
                        help="skip architectures that already have rows of every command run")
    args = parser.parse_args(argv)
    commands = [c for c in args.commands.split(",") if c]
    unknown = sorted(set(commands) - set(COMMANDS))
    if unknown or not commands:
        parser.error(f"--commands: {', '.join(unknown) or 'none given'}; choose of "
                     f"{', '.join(COMMANDS)}")
    sweep = _arch_sweep()
    names, _ = sweep.choose(argparse.Namespace(only=args.only, library=args.library,
                                               timm_all=False, sample=args.sample,
                                               seed=args.seed))
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "results.jsonl"
    rows = sweep.read_rows(path)
    names = sweep.pending(names, rows, args.resume, commands)
    header = sweep.versions()
    print(f"{len(names)} architectures x {len(commands)} commands -> {path}", flush=True)
    for index, name in enumerate(names, 1):
        new = [{**run_command(c, name, args.timeout_s, args.size), **header} for c in commands]
        rows = [r for r in rows if not (r["arch"] == name and r["command"] in commands)] + new
        atomic_write_text(path, "".join(json.dumps(r, default=str) + "\n" for r in rows))
        atomic_write_text(args.out / "summary.md", summary(rows, {
            k: header[k] for k in ("commit", "torch", "transformers", "timm")}))
        print(f"[{index}/{len(names)}] {name}: "
              + ", ".join(f"{r['command']} {r['outcome']} {r['seconds']:.0f}s" for r in new),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
