"""The findings report on the terminal: the step head, the bottleneck, the ranked findings, the
recommended stack and what is already right, laid out on a rich console.

The records are in :mod:`levers.audit.report`, the words shared with the other renderers in
:mod:`levers.audit.report_format`; the capture's step summary is :mod:`levers.audit.render_summary`.
"""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from levers.audit.bottleneck import Bottleneck, explain_gap
from levers.audit.finding import Finding
from levers.audit.recommend import Recommendation
from levers.audit.report import FindingsReport, StepHead
from levers.audit.report_format import (
    HEADERS,
    PathStyle,
    class_rows,
    cost_line,
    lever_text,
    relative_path,
    saves_text,
    stack_lines,
)
from levers.units import format_bytes, format_count, format_flops, format_ms, format_seconds, format_share


def _head_text(head: StepHead) -> Text:
    text = Text()
    text.append("levers audit ", style="bold")
    text.append(head.workload, style="bold cyan")
    text.append(f" · findings for {head.gpu_title}\n")
    step = f"{format_seconds(head.step_s)} measured on {head.device}"
    if head.estimated_step_s is not None:
        step += (
            f" · {format_seconds(head.estimated_step_s)} estimated on {head.gpu_title}"
        )
    text.append("time / step   ", style="bold")
    text.append(step + "\n")
    if head.tokens_per_step:
        tok = f"{head.tokens_per_step:,} tokens/step"
        if head.tokens_per_s:
            tok += f" · {format_count(head.tokens_per_s, 'tokens/s')} measured"
        if head.estimated_tokens_per_s:
            tok += (
                f" · {format_count(head.estimated_tokens_per_s, 'tokens/s')} estimated"
            )
        text.append("tokens        ", style="bold")
        text.append(tok + "\n")
    text.append("MFU           ", style="bold")
    mfu_text = (
        "n/a"
        if head.mfu is None
        else f"{format_share(head.mfu)} ({head.mfu_provenance})"
    )
    text.append(f"{mfu_text}; {format_flops(head.model_flops)} per step\n")
    text.append("              ")
    text.append(head.mfu_formula + "\n", style="dim")
    text.append("peak memory   ", style="bold")
    text.append(f"{format_bytes(head.peak_bytes)} ({head.peak_provenance})")
    for line in head.assumptions:
        text.append("\nnote          ", style="bold")
        text.append(line, style="dim")
    return text


def _finding_text(
    rank: int, finding: Finding, path_style: PathStyle, inapplicable: dict[str, str] | None = None
) -> Text:
    r = finding.receipt
    text = Text()
    text.append(f"{rank:>2}. ", style="bold")
    text.append(
        f"{finding.code} ",
        style="bold red" if finding.severity == "high" else "bold yellow",
    )
    text.append(f"{finding.name}", style="bold")
    text.append(
        f"  [{finding.severity}] effort {finding.effort} · risk {finding.risk} · saves {saves_text(finding)}\n"
    )
    for i, receipt in enumerate(finding.receipts):
        where = (
            path_style(receipt.file)
            + f":{receipt.line}"
            + (
                f"-{receipt.end_line}"
                if receipt.end_line and receipt.end_line != receipt.line
                else ""
            )
        )
        text.append("    at   " if i == 0 else "    and  ", style="dim")
        text.append(where, style="cyan")
        text.append(f"  {receipt.code}\n")
        bits = [b for b in (receipt.module, receipt.op, receipt.shapes) if b]
        if receipt.count > 1:
            bits.append(f"{receipt.count}x per step")
        if bits:
            text.append("         " + " · ".join(bits) + "\n", style="dim")
    text.append("    what ", style="dim")
    text.append(finding.message + "\n")
    text.append("    cost ", style="dim")
    text.append(cost_line(finding) + "\n")
    if finding.cost is not None and finding.cost.basis:
        text.append("         " + finding.cost.basis + "\n", style="dim")
    text.append("    fix  ", style="dim")
    text.append(finding.fix_title, style="green")
    text.append(
        f"\n         {lever_text(finding, inapplicable)} · fix safety: {finding.fix_safety}",
        style="dim",
    )
    del r
    return text


def render_findings(
    report: FindingsReport, console: Console, *, path_style: PathStyle = relative_path
) -> None:
    """Print the head, the ranked findings and the already-right list."""
    console.print(_head_text(report.head))
    console.print()
    if report.bottleneck is not None:
        render_bottleneck(report.bottleneck, console)
        console.print()
    n = len(report.findings)
    console.print(
        Text(
            f"Findings ({n}, ranked by payoff: time saved per step and memory freed)",
            style="bold",
        )
    )
    if not report.findings:
        console.print("  none")
    inapplicable = getattr(report.recommendation, "inapplicable", None)
    for rank, finding in enumerate(report.findings, start=1):
        console.print(_finding_text(rank, finding, path_style, inapplicable))
    console.print()
    if report.recommendation is not None:
        render_recommendation(report.recommendation, console)
        console.print()
    console.print(Text("Already right (don't re-fix)", style="bold"))
    if not report.already_right:
        console.print("  nothing to list")
    for item in report.already_right:
        line = Text("  ✓ ", style="green")
        line.append(item.title, style="bold")
        line.append(f": {item.detail}")
        if item.code:
            line.append(f" [{item.code}]", style="dim")
        console.print(line)


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


def render_recommendation(rec: Recommendation, console) -> None:
    console.print(Text("Recommended stack", style="bold"))
    for line in stack_lines(rec):
        console.print(Text("  " + line), soft_wrap=True)
