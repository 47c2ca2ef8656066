"""The findings report as Markdown, ready to paste into a pull request."""

from __future__ import annotations

from levers.audit.bottleneck import Bottleneck, explain_gap
from levers.audit.report import FindingsReport
from levers.audit.report_format import (
    HEADERS,
    PathStyle,
    class_rows,
    cost_line,
    lever_text,
    receipt_where,
    relative_path,
    saves_text,
    stack_lines,
)
from levers.units import format_bytes, format_count, format_flops, format_ms, format_seconds, format_share


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


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


def findings_markdown(
    report: FindingsReport, *, path_style: PathStyle = relative_path
) -> str:
    head = report.head
    lines = [f"## levers audit `{head.workload}`", ""]
    step = f"{format_seconds(head.step_s)} measured on {head.device}"
    if head.estimated_step_s is not None:
        step += (
            f"; {format_seconds(head.estimated_step_s)} estimated on {head.gpu_title}"
        )
    lines.append(f"- **time / step**: {step}")
    if head.tokens_per_step:
        tok = f"{head.tokens_per_step:,} tokens/step"
        if head.tokens_per_s:
            tok += f"; {format_count(head.tokens_per_s, 'tokens/s')} measured"
        if head.estimated_tokens_per_s:
            tok += (
                f"; {format_count(head.estimated_tokens_per_s, 'tokens/s')} estimated"
            )
        lines.append(f"- **tokens**: {tok}")
    mfu = (
        "n/a"
        if head.mfu is None
        else f"{format_share(head.mfu)} ({head.mfu_provenance})"
    )
    lines.append(
        f"- **MFU**: {mfu}; {format_flops(head.model_flops)} per step. {head.mfu_formula}"
    )
    lines.append(
        f"- **peak memory**: {format_bytes(head.peak_bytes)} ({head.peak_provenance})"
    )
    for note in head.assumptions:
        lines.append(f"- _note_: {note}")
    if report.bottleneck is not None:
        lines += [""] + bottleneck_markdown(report.bottleneck)
    lines += ["", f"### Findings ({len(report.findings)})", ""]
    if report.findings:
        lines.append("| # | rule | where | saves | effort | risk |")
        lines.append("| --- | --- | --- | --- | --- | --- |")
        for rank, f in enumerate(report.findings, start=1):
            lines.append(
                f"| {rank} | {f.code} {f.name} | `{_cell(receipt_where(f, path_style))}` | "
                f"{_cell(saves_text(f))} | {f.effort} | {f.risk} |"
            )
        lines.append("")
        inapplicable = getattr(report.recommendation, "inapplicable", None)
        for rank, f in enumerate(report.findings, start=1):
            lines.append(f"**{rank}. {f.code} {f.name}** ({f.severity})")
            lines.append("")
            for r in f.receipts:
                where = f"{path_style(r.file)}:{r.line}" + (
                    f"-{r.end_line}" if r.end_line and r.end_line != r.line else ""
                )
                detail = " · ".join(b for b in (r.module, r.op, r.shapes) if b)
                count = f" · {r.count}x per step" if r.count > 1 else ""
                lines.append(f"- `{where}`: `{r.code}` ({detail}{count})")
            lines.append(f"- {f.message}")
            lines.append(
                f"- cost: {cost_line(f)}"
                + (f" — {f.cost.basis}" if f.cost and f.cost.basis else "")
            )
            lines.append(
                f"- fix: {f.fix_title} ({lever_text(f, inapplicable)}; fix safety: {f.fix_safety}; effort {f.effort}, risk {f.risk})"
            )
            lines.append("")
    else:
        lines += ["None.", ""]
    if report.recommendation is not None:
        lines += ["### Recommended stack", ""]
        lines += [
            f"- {line}" for line in stack_lines(report.recommendation)
            if not line.startswith("prove it on your step:")  # the command goes below, as code
        ]
        if report.recommendation.command:
            lines += ["", "```sh", report.recommendation.command, "```"]
        lines.append("")
    lines += ["### Already right (don't re-fix)", ""]
    for item in report.already_right:
        code = f" [{item.code}]" if item.code else ""
        lines.append(f"- **{item.title}**: {item.detail}{code}")
    if not report.already_right:
        lines.append("Nothing to list.")
    return "\n".join(lines) + "\n"
