"""The bottleneck section and the recommended stack, laid out for the terminal and Markdown.

The figures come from :mod:`levers.audit.bottleneck` and :mod:`levers.audit.recommend`; this
module only words them.
"""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from rich import box

from levers.audit.bottleneck import LAUNCH, Bottleneck, ClassTime, explain_gap
from levers.audit.recommend import Recommendation, provenance_line
from levers.units import format_bytes, format_ms, format_share


def _rate(c: ClassTime) -> str:
    if c.achieved is None or not c.peak:
        return "-"
    if c.bound == "FLOP":
        return f"{c.achieved / 1e12:.3g} of {c.peak / 1e12:.4g} TFLOP/s ({c.efficiency:.0%})"
    return f"{c.achieved / 1e9:.4g} of {c.peak / 1e9:.4g} GB/s ({c.efficiency:.0%})"


def class_rows(b: Bottleneck) -> list[tuple[str, ...]]:
    """(class, ops, time, share, against, achieved, ceiling, above ceiling) per class with time."""
    rows = []
    for c in b.classes:
        if c.num_ops == 0 and c.time_ms == 0:
            continue
        against = "gaps" if c.name == LAUNCH else ("peak FLOP/s" if c.bound == "FLOP" else "HBM")
        rows.append((
            c.name,
            f"{c.num_ops:,}" if c.name != LAUNCH else "-",
            format_ms(c.time_ms),
            format_share(c.share),
            against,
            _rate(c),
            format_ms(c.ceiling_ms) if c.name != LAUNCH else "0",
            format_ms(c.above_ceiling_ms),
        ))
    return rows


HEADERS = ("class", "ops", "time", "share", "against", "achieved", "ceiling", "above ceiling")


def bound_line(b: Bottleneck) -> str:
    return f"{b.bound}: {b.bound_reason}"


def render_bottleneck(b: Bottleneck, console) -> None:
    text = Text()
    text.append("Bottleneck    ", style="bold")
    text.append(b.bound, style="bold magenta")
    text.append(f": {b.bound_reason}")
    console.print(text)
    title = (
        f"Where the {format_ms(b.step_ms)} step goes, by op class ({b.provenance} on {b.gpu_title})"
    )
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD)
    for i, header in enumerate(HEADERS):
        table.add_column(header, justify="left" if i in (0, 4) else "right")
    for row in class_rows(b):
        table.add_row(*row)
    console.print(table)
    console.print(Text(explain_gap(b), style="dim"))


def bottleneck_markdown(b: Bottleneck) -> list[str]:
    lines = [
        "### Bottleneck",
        "",
        f"**{b.bound}**: {b.bound_reason}.",
        "",
        f"Where the {format_ms(b.step_ms)} step goes, by op class ({b.provenance} on {b.gpu_title}):",
        "",
        "| " + " | ".join(HEADERS) + " |",
        "| " + " | ".join("---" for _ in HEADERS) + " |",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in class_rows(b)]
    lines += ["", explain_gap(b), ""]
    return lines


def stack_lines(rec: Recommendation) -> list[str]:
    if not rec.levers:
        return ["no lever to recommend: nothing the audit found pays"]
    out = [f"stack: {', '.join(f'{lever} ({code})' for lever, code in zip(rec.levers, rec.codes))}"]
    out.append(provenance_line(rec))
    if rec.missing:
        out.append(f"not implemented yet: {', '.join(rec.missing)}")
    out += list(rec.notes)
    if rec.command:
        out.append(f"prove it on your step: {rec.command}")
    out += list(rec.next_steps)
    return out


def render_recommendation(rec: Recommendation, console) -> None:
    console.print(Text("Recommended stack", style="bold"))
    for line in stack_lines(rec):
        console.print(Text("  " + line), soft_wrap=True)


def free_text(b: Bottleneck) -> str:
    return "?" if b.free_bytes is None else format_bytes(b.free_bytes)
