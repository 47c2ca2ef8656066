"""The audit report's figures in words, shared by every renderer (terminal, Markdown, HTML).

Plain strings only: no terminal code, so the Markdown and HTML renderers import nothing of the
terminal's. The records are in :mod:`levers.audit.report`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from levers.audit.bottleneck import LAUNCH, Bottleneck, ClassTime
from levers.audit.finding import Finding
from levers.audit.paths import display_path
from levers.audit.recommend import (
    Recommendation,
    implemented_levers,
    lever_ids,
    provenance_line,
)
from levers.levers.lever import lever_id_of
from levers.units import format_bytes, format_ms, format_share

PathStyle = Callable[[str], str]


def relative_path(path: str) -> str:
    """``path`` as every table names it (:func:`levers.audit.paths.display_path`)."""
    return display_path(path)


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


def lever_text(finding: Finding, inapplicable: Mapping[str, str] | None = None) -> str:
    """The levers that fix ``finding``; ``inapplicable`` (lever -> why, the capture's answers on
    the model) marks those that cannot act on this model, and a finding none of whose levers
    can is a code change at its line."""
    ids = lever_ids(finding)
    if not ids:
        return "no lever (a code change)"
    inapplicable = inapplicable or {}
    if all(lever_id_of(lever) in inapplicable for lever in ids):
        names = " or ".join(ids)
        return f"a code change: {names} {'does' if len(ids) == 1 else 'do'} not apply to this model"
    have = implemented_levers()
    named = [
        f"{lever} (does not apply to this model)" if lever_id_of(lever) in inapplicable
        else lever if lever in have else f"{lever} (not implemented yet)"
        for lever in ids
    ]
    return ("lever " if len(ids) == 1 else "levers ") + " or ".join(named)


def receipt_where(finding: Finding, path_style: PathStyle) -> str:
    r = finding.receipt
    file = path_style(r.file)
    if r.end_line is not None and r.end_line != r.line:
        return f"{file}:{r.line}-{r.end_line}"
    return f"{file}:{r.line}"


# --- the bottleneck and the recommended stack ----------------------------------------------


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
