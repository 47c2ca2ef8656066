"""Plain-text cells shared by the terminal and Markdown renderers."""

from __future__ import annotations

from typing import Any

from levers.ab.reads import Read
from levers.ab.runner import AbResult
from levers.ab.stats import Summary

HEADERS = ("read", "baseline", "candidate", "ratio [CI95]", "verdict", "note")
LABELS = {
    "step_time": "step time",
    "tokens_per_s": "tokens/s",
    "peak_allocated": "peak allocated",
    "peak_reserved": "peak reserved (pool)",
    "parity": "parity",
}


def quantity(value: float, unit: str) -> str:
    if unit == "bytes":
        for scale, name in ((1024**3, "GiB"), (1024**2, "MiB"), (1024, "KiB")):
            if abs(value) >= scale:
                return f"{value / scale:.2f} {name}"
        return f"{value:.0f} B"
    if unit == "ms":
        return f"{value:.3f} ms" if value < 10 else f"{value:.1f} ms"
    if unit == "tokens/s":
        return f"{value:,.0f}"
    return f"{value:g}"


def summary_cell(summary: Summary | None, unit: str) -> str:
    if summary is None:
        return "n/a"
    return (
        f"{quantity(summary.median, unit)} "
        f"[{quantity(summary.p10, unit)}, {quantity(summary.p90, unit)}]"
    )


def ratio_cell(read: Read) -> str:
    if read.ci is None:
        return "n/a"
    return f"{read.ci.ratio:.4f} [{read.ci.lo:.4f}, {read.ci.hi:.4f}]"


def rows(result: AbResult) -> list[tuple[str, ...]]:
    return [
        (
            LABELS.get(read.name, read.name),
            summary_cell(read.baseline, read.unit),
            summary_cell(read.candidate, read.unit),
            ratio_cell(read),
            read.verdict,
            read.note,
        )
        for read in result.reads
    ]


def side_line(result: AbResult, side: str) -> str:
    info = getattr(result, side)
    if info is None:
        return f"{side}: not built"
    params = ", ".join(f"{k}={v}" for k, v in info.params.items())
    levers = f" levers={','.join(info.levers)}" if info.levers else ""
    spec = info.spec or info.name
    return f"{side}: {spec} ({params}){levers} on {info.device}"


def design_line(result: AbResult) -> str:
    c = result.config
    order = "one side at a time" if c.sides == "one-at-a-time" else "alternating"
    if order == "alternating" and c.window_s:  # the window the run used (run_ab sets it)
        order = f"alternating in windows of about {c.window_s:g} s"
    return (
        f"{c.num_parity_steps} parity + {c.num_warmup} warm-up + {c.num_steps} timed steps per "
        f"side, {order}; {c.exactness}; ratio = candidate/baseline of medians, paired "
        f"bootstrap CI95 ({c.num_resamples} resamples, seed {c.seed}); sides: median [p10, p90]"
    )


def quality_line(quality: Any) -> str:
    """The quality read (held-out per-example loss, paired) in one line."""
    if quality.ci is None:
        return f"quality (held-out loss): {quality.verdict}: {quality.note}"
    ci = quality.ci
    return (
        f"quality (held-out loss, candidate - baseline): {ci.difference:+.4g} "
        f"CI95 [{ci.lo:+.4g}, {ci.hi:+.4g}] over {quality.num_examples} examples: {quality.verdict}"
    )
