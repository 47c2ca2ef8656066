"""``levers list``: every lever with its safety, the findings it fixes and its measured effect.

    levers list [--json [FILE]] [--catalogue FILE]

The measured effect comes from the committed catalogue (:mod:`levers.levers.catalogue`): the
tokens/s ratio and peak-memory change against the baseline with CI95, the workload and shape,
GPU, torch version, commit and date. A lever without a row says "not measured"; a lever measured
to do nothing, to slow the step or to fail is shown as such.

What runs the verb is imported inside its functions: ``levers --help`` loads this module and
must not import torch (:mod:`levers.cli`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from levers.cli.options import STDOUT, add_output_arguments
from levers.errors import LeversError
from levers.output.atomic import atomic_write_text
from levers.output.console import make_console, say_wrote

GIB = float(1 << 30)


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "list",
        help="the levers, each with its measured effect",
        description="Every lever levers can apply (levers ab --lever, levers.apply), with its fix "
        "safety, the finding codes it fixes and its measured effect from the committed catalogue.",
    )
    add_output_arguments(parser, json="the catalogue instead of a table", stdout=True)
    parser.add_argument(
        "--catalogue", metavar="FILE", default=None,
        help="read this catalogue file (default: $LEVERS_CATALOGUE, else bench/results/"
        "levers_catalogue_*/catalogue.json)",
    )
    parser.set_defaults(func=run)
    return parser


def _gib(value: float | None) -> str:
    return "?" if value is None else f"{value / GIB:+.1f} GiB"


def describe(row: Any) -> str:
    if row.status != "ok":
        return f"FAILED ({row.error or 'no error recorded'}) at {row.workload} {row.shape}"
    memory = _gib(row.peak_allocated_delta_bytes)
    if row.peak_allocated_delta_ci95 is not None:
        mlow, mhigh = row.peak_allocated_delta_ci95
        memory += f" [{mlow / GIB:+.1f}, {mhigh / GIB:+.1f}]"
    if row.tokens_per_s_ratio is None:
        speed = "tokens/s not timed"
    else:
        low, high = row.tokens_per_s_ratio_ci95 or (float("nan"), float("nan"))
        speed = f"{row.tokens_per_s_ratio:.2f}x tokens/s [{low:.2f}, {high:.2f}] ({row.effect})"
    text = (
        f"{speed}, peak allocated {memory}, reserved {_gib(row.peak_reserved_delta_bytes)}; "
        f"{row.workload} {row.shape} vs {row.baseline}"
    )
    if row.quality:
        text += f"; quality: {row.quality}"
    if row.note:
        text += f" ({row.note})"
    return text


def summary(rows: list[Any]) -> str | None:
    """One line over a lever's timed rows, where it has two or more: how many were faster, of no
    effect and slower, and the range and median of their tokens/s ratios."""
    from statistics import median

    timed = [row for row in rows if row.status == "ok" and row.tokens_per_s_ratio is not None]
    if len(timed) < 2:
        return None
    ratios = sorted(float(row.tokens_per_s_ratio) for row in timed)
    counts = {effect: sum(row.effect == effect for row in timed)
              for effect in ("faster", "no effect", "slower")}
    return (f"{len(timed)} timed rows: {counts['faster']} faster, {counts['no effect']} no "
            f"effect, {counts['slower']} slower; tokens/s {ratios[0]:.2f}x-{ratios[-1]:.2f}x, "
            f"median {median(ratios):.2f}x (each against the step it was added to, below)")


def _provenance(row: Any) -> str:
    return f"{row.gpu}, torch {row.torch}, commit {row.commit[:10]}, {row.date}"


class _Lines:
    """Plain lines through the shared console (no markup: ids and errors hold brackets)."""

    def __init__(self, console: Any) -> None:
        self.console = console

    def write(self, text: str) -> None:
        self.console.print(text.rstrip("\n"), markup=False, soft_wrap=True)


def _write_json(doc: dict[str, Any], path: Path) -> None:
    text = json.dumps(doc, indent=2) + "\n"
    if path == STDOUT:
        sys.stdout.write(text)
        return
    try:
        atomic_write_text(path, text, make_parents=True)
    except OSError as exc:
        raise LeversError(f"cannot write {path}: {exc.strerror or exc}; choose another path") from None
    say_wrote(path)


def run(args: argparse.Namespace) -> int:
    from levers.levers.metadata import lever_infos
    from levers.levers.catalogue import measurements_by_lever, read_catalogue

    try:
        measured = measurements_by_lever(read_catalogue(args.catalogue))
    except (FileNotFoundError, ValueError, KeyError) as exc:
        raise LeversError(f"cannot read the lever catalogue: {exc}") from None
    # read from the lever modules' source: importing them (and torch) would cost seconds
    registry = {info.id: info for info in lever_infos()}
    if args.json_path is not None:
        doc = [
            {
                "id": lever.id,
                "title": lever.title,
                "safety": lever.safety,
                "tolerance": lever.tolerance,
                "fixes": list(lever.fixes),
                "needs_gpu": lever.needs_gpu,
                "known_problems": lever.known_problems,
                "measured": [row.to_dict() for row in measured.get(lever.id, [])],
            }
            for lever in registry.values()
        ]
        stacks = [row.to_dict() for lever_id, rows in measured.items()
                  if lever_id not in registry for row in rows]
        _write_json({"levers": doc, "stacks": stacks}, args.json_path)
        return 0

    console = make_console()
    out = _Lines(console)
    for lever in registry.values():
        safety = lever.safety if lever.tolerance is None else f"{lever.safety} (rtol {lever.tolerance:g})"
        fixes = ", ".join(lever.fixes) or "no finding yet (levers tune tries it)"
        out.write(f"{lever.id}  [{safety}]  fixes {fixes}\n")
        out.write(f"    {lever.title}\n")
        rows = measured.get(lever.id, [])
        over_rows = summary(rows)
        if not rows:
            out.write("    measured: not measured\n")
        elif over_rows:
            out.write(f"    measured on {over_rows}\n")
        for row in rows:
            out.write(f"    measured: {describe(row)}\n")
            out.write(f"              {_provenance(row)}\n")
        if lever.known_problems:
            out.write(f"    known problems: {lever.known_problems}\n")
    stacks = [row for lever_id, rows in measured.items() if lever_id not in registry for row in rows]
    if stacks:
        out.write("\nstacks and peers measured in the same runs:\n")
        for row in stacks:
            out.write(f"  {row.lever}: {describe(row)}\n")
    return 0
