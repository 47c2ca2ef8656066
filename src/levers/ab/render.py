"""The terminal view of an A/B result (rich)."""

from __future__ import annotations

from typing import Sequence

from rich.console import Console
from rich.table import Table

from levers.ab.expectations import Outcome
from levers.ab.format import HEADERS, design_line, quality_line, rows, side_line
from levers.ab.runner import AbResult
from levers.ab.verdict import DAMAGED, IMPROVED, KILLED, PARITY
from levers.output.console import make_console

STYLES = {IMPROVED: "bold green", PARITY: "yellow", DAMAGED: "bold red", KILLED: "bold red"}


def _styled(verdict: str) -> str:
    style = STYLES.get(verdict)
    return f"[{style}]{verdict}[/]" if style else verdict


def print_result(
    result: AbResult, outcomes: Sequence[Outcome] = (), console: Console | None = None
) -> None:
    console = console or make_console()
    console.print(side_line(result, "baseline"), highlight=False, markup=False)
    console.print(side_line(result, "candidate"), highlight=False, markup=False)
    console.print(design_line(result), style="dim", highlight=False, markup=False)
    table = Table(show_lines=False)
    for header in HEADERS[:5]:
        table.add_column(header, overflow="fold")
    notes = []
    for row in rows(result):
        table.add_row(*row[:4], _styled(row[4]))
        if row[5]:
            notes.append(f"  {row[0]}: {row[5]}")
    console.print(table)
    for note in notes:
        console.print(note, style="dim", highlight=False, markup=False)
    if result.quality is not None:
        console.print(quality_line(result.quality), highlight=False, markup=False)
    if outcomes:
        expectations = Table(title="pre-registered expectations")
        for header in ("#", "read", "expected", "confidence", "met", "evidence"):
            expectations.add_column(header, overflow="fold")
        for o in outcomes:
            e = o.expectation
            met = {True: "[green]met[/]", False: "[red]missed[/]", None: "not measured"}[o.met]
            expectations.add_row(
                str(e.id), e.read, f"{e.direction} by {e.size:g}", e.confidence, met, o.evidence
            )
        console.print(expectations)
    for note in result.warnings:
        console.print(f"warning: {note}", style="yellow", highlight=False, markup=False)
    if result.killed is not None:
        console.print(
            f"KILLED ({result.killed.kind}): {result.killed.message}",
            style="bold red",
            highlight=False,
            markup=False,
        )
    console.print(f"decision: {_styled(result.decision)}", highlight=False)
