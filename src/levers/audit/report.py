"""The findings report: a step summary head, ranked findings, and what is already right.

:func:`build_report` turns a Capture and its :class:`levers.audit.AuditResult` into plain
data (:class:`FindingsReport`); :func:`render_findings` lays it out on a rich console. The
Markdown and JSON forms are in :mod:`levers.audit.render_markdown` and
:mod:`levers.audit.render_json`. Step figures come from :mod:`levers.audit.summary`.

Every cost says how it was obtained: "measured" (GPU device time, GPU microbenchmark) or
"estimated" (roofline for the target GPU), and the head says which GPU the MFU is against.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.text import Text

from levers.capture.records import Capture
from levers.audit.engine import AuditResult
from levers.audit.cost.step import MFU_FORMULA, estimated_step_us, mfu, model_flops
from levers.audit.finding import Finding
from levers.audit.rank import MEMORY_WEIGHT, memory_weight, payoff
from levers.audit import summary
from levers.audit.paths import display_path
from levers.units import format_bytes, format_count, format_flops, format_ms, format_seconds, format_share
from levers.vocab import ESTIMATED, MEASURED

PathStyle = Callable[[str], str]


def relative_path(path: str) -> str:
    """``path`` as every table names it (:func:`levers.audit.paths.display_path`)."""
    return display_path(path)


@dataclass(frozen=True)
class StepHead:
    """The step summary that heads the report."""

    workload: str
    params: dict
    device: str  # what the capture ran on
    gpu_title: str  # the GPU costs and MFU refer to
    on_gpu: bool
    step_s: (
        float  # median wall time of the plain steps on the capture's device (measured)
    )
    estimated_step_s: float | None  # the step on the target GPU (CPU captures)
    tokens_per_step: int | None
    tokens_per_s: float | None  # measured on the capture's device
    estimated_tokens_per_s: float | None
    model_flops: int
    mfu: float | None
    mfu_provenance: str  # "measured" or "estimated"
    mfu_formula: str
    peak_bytes: int
    peak_provenance: (
        str  # "measured" (allocator) or "tracked" (tensor storages on a CPU)
    )
    assumptions: tuple[str, ...]


@dataclass(frozen=True)
class FindingsReport:
    head: StepHead
    findings: tuple[Finding, ...]
    payoffs: tuple[float, ...]
    already_right: tuple  # AlreadyRight items
    active_codes: tuple[str, ...]
    bottleneck: Any = None  # levers.audit.bottleneck.Bottleneck
    recommendation: Any = None  # levers.audit.recommend.Recommendation


def build_head(capture: Capture, result: AuditResult) -> StepHead:
    config = result.config
    timing = summary.timing_summary(capture)
    flops = model_flops(capture)
    peak = config.gpu.peak_flops("bfloat16")
    estimated_s = None
    if config.on_gpu:
        step_mfu, how = mfu(flops, timing.median_s, peak), MEASURED
    else:
        estimated_s = estimated_step_us(capture, config) / 1e6
        step_mfu, how = mfu(flops, estimated_s, peak), ESTIMATED
    tokens = capture.tokens_per_step
    assumptions = []
    if not config.on_gpu:
        assumptions.append(
            f"CPU capture: costs and MFU are estimated for {config.gpu.title} with torch "
            f"{config.torch_version[0]}.{config.torch_version[1]} SDPA dispatch rules"
        )
        if config.assumed_dtype:
            assumptions.append(
                f"the step ran in float32 without autocast; the GPU run is assumed to compute in "
                f"{config.assumed_dtype} (--assume-dtype)"
            )
    return StepHead(
        workload=capture.workload,
        params=dict(capture.workload_params),
        device=str(capture.env.get("device_name") or capture.env.get("device", "")),
        gpu_title=config.gpu.title,
        on_gpu=config.on_gpu,
        step_s=timing.median_s,
        estimated_step_s=estimated_s,
        tokens_per_step=tokens,
        tokens_per_s=timing.tokens_per_s,
        estimated_tokens_per_s=(tokens / estimated_s)
        if tokens and estimated_s
        else None,
        model_flops=flops,
        mfu=step_mfu,
        mfu_provenance=how,
        mfu_formula=MFU_FORMULA.format(
            gpu=config.gpu.title, peak=config.gpu.bf16_tflops
        ),
        peak_bytes=capture.memory.peak_bytes,
        peak_provenance=MEASURED
        if capture.memory.source == "cuda-allocator"
        else "tracked",
        assumptions=tuple(assumptions),
    )


def build_report(capture: Capture, result: AuditResult) -> FindingsReport:
    weight = memory_weight(result.bottleneck.bound) if result.bottleneck else MEMORY_WEIGHT
    pays = tuple(
        payoff(f, step_ms=result.step_ms, peak_bytes=capture.memory.peak_bytes, weight=weight)
        for f in result.findings
    )
    return FindingsReport(
        head=build_head(capture, result),
        findings=result.findings,
        payoffs=pays,
        already_right=result.already_right,
        active_codes=result.active_codes,
        bottleneck=result.bottleneck,
        recommendation=result.recommendation,
    )


# --- words shared by the renderers ----------------------------------------------------------




def cost_line(finding: Finding) -> str:
    """``0.97 ms now, 0.075 ms fixed per step (measured) · frees 12 MiB``."""
    cost = finding.cost
    if cost is None or cost.provenance == "none":
        return "no per-step time or memory cost (observability)"
    parts = []
    if cost.now_ms is not None:
        fixed_how = cost.fixed_provenance or cost.provenance
        if fixed_how == cost.provenance:
            parts.append(
                f"{format_ms(cost.now_ms)} now, {format_ms(cost.fixed_ms)} fixed per step ({cost.provenance})"
            )
        else:
            parts.append(
                f"{format_ms(cost.now_ms)} now ({cost.provenance}), {format_ms(cost.fixed_ms)} fixed "
                f"({fixed_how}) per step"
            )
        if cost.calls_per_step > 1 and cost.per_call_now_ms is not None:
            parts.append(
                f"per call {format_ms(cost.per_call_now_ms)} -> {format_ms(cost.per_call_fixed_ms)}"
            )
    if cost.saved_bytes:
        parts.append(f"frees {format_bytes(cost.saved_bytes)}")
    return " · ".join(parts)


def saves_text(finding: Finding) -> str:
    cost = finding.cost
    if cost is None or cost.provenance == "none":
        return "-"
    bits = []
    delta = None
    if cost.now_ms is not None and cost.fixed_ms is not None:
        delta = cost.now_ms - cost.fixed_ms
    if delta is not None and delta >= 0:
        bits.append(f"{format_ms(delta)}/step")
    if cost.saved_bytes or (delta is not None and delta < 0):
        bits.append(format_bytes(cost.saved_bytes))  # "0 B for +x ms/step": a cost, no saving
    if delta is not None and delta < 0:
        bits.append(f"for +{format_ms(-delta)}/step")
    return (
        " ".join(bits)
        if delta is not None and delta < 0
        else (", ".join(bits) if bits else "-")
    )


def lever_text(finding: Finding) -> str:
    from levers.audit.recommend import implemented_levers, lever_ids

    ids = lever_ids(finding)
    if not ids:
        return "no lever (a code change)"
    have = implemented_levers()
    named = [lever if lever in have else f"{lever} (not implemented yet)" for lever in ids]
    return ("lever " if len(ids) == 1 else "levers ") + " or ".join(named)


def receipt_where(finding: Finding, path_style: PathStyle) -> str:
    r = finding.receipt
    file = path_style(r.file)
    if r.end_line is not None and r.end_line != r.line:
        return f"{file}:{r.line}-{r.end_line}"
    return f"{file}:{r.line}"


# --- terminal --------------------------------------------------------------------------------


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


def _finding_text(rank: int, finding: Finding, path_style: PathStyle) -> Text:
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
        f"\n         {lever_text(finding)} · fix safety: {finding.fix_safety}",
        style="dim",
    )
    del r
    return text


def render_findings(
    report: FindingsReport, console: Console, *, path_style: PathStyle = relative_path
) -> None:
    """Print the head, the ranked findings and the already-right list."""
    from levers.audit.render_bottleneck import render_bottleneck, render_recommendation

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
    for rank, finding in enumerate(report.findings, start=1):
        console.print(_finding_text(rank, finding, path_style))
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
