"""Render the step summary of a Capture to a rich console.

Every figure comes from :mod:`levers.audit.summary`; this module only lays it out. Each
figure says how it was obtained (measured, counted, estimated or tracked) from the capture's
provenance, so a reader never mistakes an estimate for a measurement.
"""

from __future__ import annotations


from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from levers.capture.records import Capture, CapturePasses
from levers.audit import summary
from levers.audit.paths import display_path
from levers.units import (
    format_bytes,
    format_count,
    format_flops,
    format_seconds,
    format_share,
    format_us,
)
from levers.vocab import COUNTED, ESTIMATED, MEASURED, TRACKED

_MIN_TABLE_WIDTH = 60  # keeps a narrow table's title on one line
_MAX_CODE_CHARS = 44
_MAX_LOCATION_CHARS = 60  # a source line's code is context; the location and figures come first
_KEY_TITLES = {"flops": "FLOPs", "bytes": "bytes moved", "device_us": "device time"}


def render_summary(capture: Capture, console: Console, top_n: int = 5) -> None:
    """Print the header, step figures, phase table, top-N tables and call records."""
    ops = capture.ops
    for renderable in (
        _header(capture),
        _step_grid(capture),
        _phase_table(capture),
    ):
        console.print(renderable)
        console.print()
    keys = ["flops", "bytes"] + (["device_us"] if summary.has_device_time(ops) else [])
    for key in keys:
        title = _KEY_TITLES[key]
        modules = summary.top_modules(ops, key, top_n)
        sources = summary.top_sources(ops, key, top_n)
        console.print(_top_table(f"Top modules by {title}", modules, key, source=False))
        console.print(_top_table(f"Top source lines by {title}", sources, key, source=True))
        console.print()
    calls = summary.call_summary(capture.calls)
    console.print(_calls_table(calls))
    if calls.sync_sites:
        console.print(_sync_table(calls.sync_sites, top_n))


def _header(capture: Capture) -> Text:
    env = capture.env
    text = Text()
    text.append("levers audit ", style="bold")
    text.append(capture.workload, style="bold cyan")
    if capture.workload_params:
        params = ", ".join(f"{k}={v!r}" for k, v in capture.workload_params.items())
        text.append(f" ({params})")
    text.append("\n")
    device = str(env.get("device", "unknown device"))
    name = env.get("device_name")
    text.append(f"device {device}" + (f" ({name})" if name and name != device else ""))
    text.append(f" · torch {env.get('torch', '?')}")
    if env.get("python"):
        text.append(f" · python {env['python']}")
    if env.get("git_commit") or env.get("commit"):
        text.append(f" · commit {str(env.get('git_commit') or env.get('commit'))[:12]}")
    text.append("\n")
    text.append("figures: ", style="bold")
    text.append(describe_provenance(capture.provenance) or "no provenance recorded")
    return text


def describe_provenance(provenance: dict[str, str]) -> str:
    """``measured: wall_time · counted: bytes, flops`` grouped by how figures were obtained."""
    groups: dict[str, list[str]] = {}
    for figure, how in provenance.items():
        groups.setdefault(str(how), []).append(figure)
    order = [MEASURED, COUNTED, ESTIMATED, TRACKED]
    kinds = sorted(groups, key=lambda k: (order.index(k) if k in order else len(order), k))
    return " · ".join(f"{kind}: {', '.join(sorted(groups[kind]))}" for kind in kinds)


def _how(capture: Capture, *figures: str) -> str:
    """How the first of ``figures`` present in the provenance was obtained, else ``""``."""
    for figure in figures:
        how = capture.provenance.get(figure)
        if how:
            return str(how)
    return ""


def _step_grid(capture: Capture) -> Table:
    totals = summary.totals(capture.ops)
    timing = summary.timing_summary(capture)
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()
    grid.add_column(style="dim", no_wrap=True)
    grid.add_row("ops", f"{totals.num_ops:,} aten ops in one step", _how(capture, "ops", "num_ops"))
    grid.add_row("FLOPs", format_flops(totals.flops), _how(capture, "flops"))
    grid.add_row(
        "bytes moved",
        f"{format_bytes(totals.moved_bytes)} (read {format_bytes(totals.read_bytes)}, "
        f"written {format_bytes(totals.write_bytes)})",
        _how(capture, "bytes"),
    )
    grid.add_row(
        "wall time / step", _step_time(timing), _how(capture, "wall_time", "step_time", "time")
    )
    grid.add_row(
        "captured step",
        _captured_time(timing, capture.passes),
        _how(capture, "wall_time", "step_time"),
    )
    if totals.device_us is not None:
        grid.add_row("device time", format_us(totals.device_us), _how(capture, "device_time"))
    if timing.tokens_per_step:
        grid.add_row("tokens / step", f"{timing.tokens_per_step:,}", "")
        grid.add_row(
            "tokens / s",
            format_count(timing.tokens_per_s or 0.0, "tokens/s"),
            _how(capture, "wall_time", "step_time"),
        )
    grid.add_row("peak memory", _memory(capture), _how(capture, "memory", "peak_memory"))
    return grid


def _step_time(timing: summary.TimingSummary) -> str:
    if timing.num_steps == 0:
        return f"{format_seconds(timing.median_s)} (captured step only; no plain steps timed)"
    if timing.num_steps == 1:
        return f"{format_seconds(timing.median_s)} (1 plain step)"
    return (
        f"{format_seconds(timing.median_s)} median of {timing.num_steps} plain steps "
        f"(min {format_seconds(timing.min_s)}, max {format_seconds(timing.max_s)})"
    )


def _captured_time(timing: summary.TimingSummary, passes: CapturePasses | None) -> str:
    text = format_seconds(timing.captured_s)
    if timing.overhead_ratio is not None:
        text += f" ({timing.overhead_ratio:.1f}x a plain step: capture overhead)"
    if passes is None:  # a capture from before levers said how it was made
        return text
    if passes.mode == "two-pass":
        return (
            f"{text}; timed under the profiler alone, its ops aligned with "
            f"{passes.coverage:.0%} of the recorded step's"
        )
    return f"{text}; one pass: {passes.reason}"


def _memory(capture: Capture) -> str:
    mem = capture.memory
    text = (
        f"{format_bytes(mem.peak_bytes)} (start {format_bytes(mem.start_bytes)}, "
        f"end {format_bytes(mem.end_bytes)}"
    )
    if mem.peak_reserved_bytes is not None:
        text += f", reserved {format_bytes(mem.peak_reserved_bytes)}"
    return text + f"; {mem.source})"


def _phase_table(capture: Capture) -> Table:
    ops = capture.ops
    device = summary.has_device_time(ops)
    table = _table("By phase")
    table.add_column("phase")
    for header in ("ops", "FLOPs", "bytes moved") + (("device time",) if device else ()):
        table.add_column(header, justify="right")
    columns = [
        summary.by_phase(ops, "ops"),
        summary.by_phase(ops, "flops"),
        summary.by_phase(ops, "bytes"),
    ]
    if device:
        columns.append(summary.by_phase(ops, "device_us"))
    formats = [lambda v: f"{int(v):,}", format_flops, format_bytes, format_us]
    for phase in columns[0]:
        table.add_row(phase, *(fmt(col[phase]) for fmt, col in zip(formats, columns)))
    totals = summary.totals(ops)
    footer = [f"{totals.num_ops:,}", format_flops(totals.flops), format_bytes(totals.moved_bytes)]
    if device:
        footer.append(format_us(totals.device_us or 0.0))
    table.add_row("total", *footer, style="bold")
    return table


def _format_value(key: str, value: float) -> str:
    if key == "flops":
        return format_flops(value)
    if key == "bytes":
        return format_bytes(value)
    return format_us(value)


def _table(title: str) -> Table:
    return Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, min_width=_MIN_TABLE_WIDTH)


def _figure_column(table: Table, header: str) -> None:
    # figures are never cut; when the console is narrow, the location column folds instead
    table.add_column(header, justify="right", no_wrap=True, min_width=len(header))


def _location_column(table: Table, header: str, labels: list[str]) -> None:
    # kept whole where it fits: a location is what the reader copies into an editor
    widest = max((len(label) for label in labels), default=0)
    table.add_column(header, overflow="fold", min_width=min(widest, _MAX_LOCATION_CHARS))


def _code_column(table: Table) -> None:
    # last, so that a narrow console cuts the context rather than a location or a figure
    table.add_column("code", no_wrap=True, overflow="ellipsis")


def shorten_code(code: str, max_chars: int = _MAX_CODE_CHARS) -> str:
    return code if len(code) <= max_chars else code[: max_chars - 1] + "…"


def _top_table(title: str, rows: list[summary.Row], key: str, *, source: bool) -> Table:
    table = _table(title)
    # an op counts for its innermost module only, so shares add up to 100%
    labels = [short_path(row.label) if source else row.label for row in rows]
    _location_column(table, "source line" if source else "module (innermost)", labels)
    for header in (_KEY_TITLES[key], "share", "ops"):
        _figure_column(table, header)
    if source:
        _code_column(table)
    for label, row in zip(labels, rows):
        cells = [label, _format_value(key, row.value), format_share(row.share), f"{row.num_ops:,}"]
        table.add_row(*cells, *([shorten_code(row.code)] if source else []))
    if not rows:
        table.add_row(*(["(none)"] + [""] * (len(table.columns) - 1)))
    return table


def _calls_table(calls: summary.CallSummary) -> Table:
    table = _table("Calls recorded for diagnosis")
    table.add_column("kind")
    table.add_column("count", justify="right")
    table.add_column("detail")
    for kind, count in calls.counts.items():
        detail = ""
        if kind == "sdpa" and calls.sdpa_backends:
            detail = "backend ran: " + ", ".join(
                f"{b} x{n}" for b, n in calls.sdpa_backends.items()
            )
        elif kind == "sync":
            detail = f"at {len(calls.sync_sites)} source line(s), below"
        table.add_row(kind, str(count), detail)
    if not calls.counts:
        table.add_row("(none)", "0", "")
    return table


def _sync_table(sites: tuple[summary.SyncSite, ...], top_n: int) -> Table:
    title = "Host-device sync sites"
    if len(sites) > top_n:
        title += f" (top {top_n} of {len(sites)})"
    table = _table(title)
    shown = sites[:top_n]
    labels = [short_path(site.label) for site in shown]
    _location_column(table, "source line", labels)
    _figure_column(table, "count")
    table.add_column("calls")
    _code_column(table)
    for label, site in zip(labels, shown):
        names = ", ".join(site.names)
        if site.num_in_torch:
            names += f" ({site.num_in_torch} from torch)"
        table.add_row(label, str(site.count), names, shorten_code(site.code))
    return table


def short_path(label: str) -> str:
    """A ``file:line`` label, relative to the current directory or to site-packages if inside."""
    path, sep, line = label.rpartition(":")
    if not sep:
        return label
    return f"{display_path(path)}:{line}"

