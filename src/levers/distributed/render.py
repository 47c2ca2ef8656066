"""The merged report of a launch, in the terminal and as Markdown (JSON is ``to_dict``)."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from levers.distributed.merge import DistributedReport
from levers.distributed.summary import RankSummary
from levers.units import format_bytes, format_seconds, format_share, format_us

MAX_BUCKETS_SHOWN = 8


def _share(part_us: float, r: RankSummary) -> str:
    total = r.compute_us + r.comm_us + r.idle_us
    return format_share(part_us / total) if total > 0 else "-"


def rank_rows(report: DistributedReport) -> list[list[str]]:
    """One row per rank: rank, step, compute, communication, idle (or the error)."""
    rows = []
    for r in report.ranks:
        if r.error is not None:
            rows.append([str(r.rank), "raised", r.error, "", ""])
            continue
        rows.append(
            [
                str(r.rank),
                format_seconds(r.median_step_s or 0.0),
                f"{format_us(r.compute_us)} ({_share(r.compute_us, r)})",
                f"{format_us(r.comm_us)} ({_share(r.comm_us, r)})",
                f"{format_us(r.idle_us)} ({_share(r.idle_us, r)})",
            ]
        )
    for rank in report.missing:
        rows.append([str(rank), "no answer", f"within {report.timeout_s:g} s", "", ""])
    return rows


def collective_rows(report: DistributedReport) -> list[list[str]]:
    rows = []
    for r in report.ranks:
        for c in r.collectives:
            rows.append(
                [str(r.rank), c.name, str(c.count), format_bytes(c.bytes), format_us(c.time_us)]
            )
    return rows


def bucket_line(r: RankSummary) -> str:
    shown = ", ".join(format_bytes(b.bytes) for b in r.buckets[:MAX_BUCKETS_SHOWN])
    more = len(r.buckets) - MAX_BUCKETS_SHOWN
    tail = f", ... ({more} more)" if more > 0 else ""
    dtypes = sorted({b.dtype for b in r.buckets})
    ddp = (r.distributed or {}).get("ddp") or {}
    cap = f", bucket_cap_mb={ddp['bucket_cap_mb']:g}" if ddp.get("bucket_cap_mb") else ""
    return (
        f"rank {r.rank}: {len(r.buckets)} DDP bucket all-reduce{'s' if len(r.buckets) > 1 else ''} "
        f"({'/'.join(dtypes)}{cap}): "
        f"{shown}{tail}"
    )


def exposed_line(r: RankSummary) -> str | None:
    """DDP's own timing of backward's communication and how much of it backward hid."""
    logging = ((r.distributed or {}).get("ddp") or {}).get("logging") or {}
    comm_ns = logging.get("backward_comm_time")
    overlap_ns = logging.get("backward_compute_comm_overlap_time")
    if not comm_ns or overlap_ns is None:
        return None
    exposed_ns = max(comm_ns - overlap_ns, 0)
    return (
        f"rank {r.rank}: DDP's own timing of iteration {logging.get('iteration')}: backward "
        f"communication {format_us(comm_ns / 1e3)}, {format_us(overlap_ns / 1e3)} of it overlapped "
        f"with backward compute, {format_us(exposed_ns / 1e3)} exposed"
    )


def straggler_line(report: DistributedReport) -> str | None:
    s = report.straggler
    if s is None:
        return None
    return (
        f"straggler: rank {s.rank}, {format_seconds(s.step_s)} per step, "
        f"{format_share(s.over_median)} over the median rank ({format_seconds(s.median_s)})"
    )


def _timing_source(report: DistributedReport) -> str:
    sources = sorted({r.timing_source for r in report.ranks if r.timing_source})
    return "; ".join(sources) or "no rank was captured"


HEADERS = ["rank", "step (median)", "compute", "communication", "idle"]
COLLECTIVE_HEADERS = ["rank", "collective", "calls", "bytes", "time"]


def render(report: DistributedReport, console: Any) -> None:
    console.print()
    console.print(
        f"[bold]Ranks[/bold]: {len(report.ranks)} of {report.world_size} answered", highlight=False
    )
    table = Table(*HEADERS, box=None, pad_edge=False)
    for row in rank_rows(report):
        table.add_row(*row)
    console.print(table)
    console.print(
        f"compute / communication / idle: {_timing_source(report)}; communication is the c10d "
        "collective ops (on gloo, the time to enqueue them; their wait is idle time)",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
    line = straggler_line(report)
    if line:
        console.print(line, markup=False, highlight=False)
    rows = collective_rows(report)
    if rows:
        table = Table(*COLLECTIVE_HEADERS, box=None, pad_edge=False, title="Communication by collective", title_justify="left")
        for row in rows:
            table.add_row(*row)
        console.print(table)
    for r in report.ranks:
        if r.buckets:
            console.print(bucket_line(r), markup=False, highlight=False, soft_wrap=True)
        exposed = exposed_line(r)
        if exposed:
            console.print(exposed, markup=False, highlight=False, soft_wrap=True)
    for message in report.failure_messages():
        console.print(f"[red]{message}[/red]", highlight=False, soft_wrap=True)


def _md_table(headers: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def markdown(report: DistributedReport) -> str:
    parts = [
        f"## Ranks ({len(report.ranks)} of {report.world_size} answered)",
        "",
        _md_table(HEADERS, rank_rows(report)),
        "",
        f"Compute / communication / idle: {_timing_source(report)}.",
    ]
    line = straggler_line(report)
    if line:
        parts += ["", line[0].upper() + line[1:] + "."]
    rows = collective_rows(report)
    if rows:
        parts += ["", "### Communication by collective", "", _md_table(COLLECTIVE_HEADERS, rows)]
    buckets = [bucket_line(r) for r in report.ranks if r.buckets]
    buckets += [line for line in (exposed_line(r) for r in report.ranks) if line]
    if buckets:
        parts += [""] + [f"- {b}" for b in buckets]
    failures = report.failure_messages()
    if failures:
        parts += ["", "### Failures", ""] + [f"- {m}" for m in failures]
    return "\n".join(parts) + "\n"
