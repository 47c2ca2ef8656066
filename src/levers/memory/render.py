"""Print a :class:`MemoryPlan` with rich: the verdict first, then what fills the peak."""

from __future__ import annotations

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from levers.memory.plan import FitResult, MemoryPlan
from levers.units import format_bytes, format_parameters

NUM_MODULES = 8
NUM_TENSORS = 8
NUM_AROUND = 8
BAR_WIDTH = 24




def _signed(num_bytes: int) -> str:
    return ("+" if num_bytes > 0 else "") + format_bytes(num_bytes)


def _bar(part: int, whole: int) -> str:
    filled = round(BAR_WIDTH * part / whole) if whole > 0 else 0
    return "█" * filled + "·" * (BAR_WIDTH - filled)


def _table(title: str) -> Table:
    return Table(title=title, title_justify="left", show_edge=False, pad_edge=False, box=None)


def render_plan(plan: MemoryPlan, console: Console) -> None:
    console.print(_header(plan))
    console.print(_verdict(plan))
    console.print(_peaks(plan))
    console.print(_categories(plan))
    console.print(_moment(plan))
    if plan.activations_by_module:
        console.print(_modules(plan))
    console.print(_largest(plan))
    console.print(_around(plan))
    if plan.attention:
        console.print(_attention(plan))
    if plan.whatifs:
        console.print(_whatifs(plan))
    if plan.fit is not None:
        console.print(_fit(plan.fit))
    for lever_id, why in (plan.extra.get("levers_skipped") or {}).items():
        console.print(Text(f"not predicted with lever {lever_id}: {why}", style="yellow"))
    for note in plan.assumptions:
        console.print(Text(f"assumption: {note}", style="dim"))


def _header(plan: MemoryPlan) -> Text:
    params = " ".join(f"{k}={v}" for k, v in plan.params.items())
    text = Text()
    text.append(f"levers memory · {plan.workload}", style="bold")
    text.append(f" on {plan.gpu.name} ({plan.gpu.description})\n")
    text.append(
        f"predicted on fake tensors (no GPU memory used) · build + {plan.num_steps} steps · "
        f"{format_parameters(plan.num_parameters)} parameters · {plan.seconds:.1f} s\n",
        style="dim",
    )
    if params:
        text.append(params, style="dim")
    return text


def _verdict(plan: MemoryPlan) -> Text:
    budget = int(plan.usable_bytes * (1 - plan.margin))
    if plan.fits:
        return Text(
            f"FITS: reserved peak {format_bytes(plan.peak_reserved_bytes)} of a "
            f"{format_bytes(budget)} budget ({format_bytes(plan.usable_bytes)} usable − "
            f"{plan.margin:.0%} margin); {format_bytes(budget - plan.peak_reserved_bytes)} to spare",
            style="bold green",
        )
    return Text(
        f"DOES NOT FIT: reserved peak {format_bytes(plan.peak_reserved_bytes)} > "
        f"{format_bytes(budget)} budget ({format_bytes(plan.usable_bytes)} usable − "
        f"{plan.margin:.0%} margin); {format_bytes(plan.peak_reserved_bytes - budget)} over",
        style="bold red",
    )


def _peaks(plan: MemoryPlan) -> Table:
    table = _table("Peaks")
    table.add_column("")
    table.add_column("predicted", justify="right")
    if plan.measured is not None:
        table.add_column(f"measured ({plan.measured.device_name})", justify="right")
        table.add_column("error", justify="right")
    rows = (
        (
            "max_memory_allocated",
            plan.peak_allocated_bytes,
            plan.measured.peak_allocated_bytes if plan.measured else None,
        ),
        (
            "max_memory_reserved",
            plan.peak_reserved_bytes,
            plan.measured.peak_reserved_bytes if plan.measured else None,
        ),
    )
    for label, predicted, measured in rows:
        cells = [label, format_bytes(predicted)]
        if plan.measured is not None:
            error = 100.0 * (predicted - measured) / measured if measured else 0.0
            cells += [format_bytes(measured), f"{error:+.1f}%"]
        table.add_row(*cells)
    return table


def _categories(plan: MemoryPlan) -> Table:
    table = _table(f"At the allocated peak ({format_bytes(plan.peak_allocated_bytes)})")
    table.add_column("category")
    table.add_column("bytes", justify="right")
    table.add_column("share", justify="right")
    table.add_column("")
    for entry in plan.by_category:
        share = entry.nbytes / plan.peak_allocated_bytes if plan.peak_allocated_bytes else 0.0
        table.add_row(
            entry.category,
            format_bytes(entry.nbytes),
            f"{share:.0%}",
            _bar(entry.nbytes, plan.peak_allocated_bytes),
        )
    return table


def _moment(plan: MemoryPlan) -> Text:
    peak = plan.peak
    where = peak.module if peak.module else "(outside modules)"
    if peak.source:
        where += f" at {peak.source}"
    return Text(
        f"The peak: step {peak.step} {peak.phase}, {where}, allocating in {peak.op}",
        style="bold",
    )


def _modules(plan: MemoryPlan) -> Table:
    table = _table("Activations kept for backward at the peak, by block")
    table.add_column("module")
    table.add_column("bytes", justify="right")
    shown = plan.activations_by_module[:NUM_MODULES]
    for entry in shown:
        table.add_row(entry.module, format_bytes(entry.nbytes))
    rest = plan.activations_by_module[NUM_MODULES:]
    if rest:
        table.add_row(f"… {len(rest)} more", format_bytes(sum(e.nbytes for e in rest)))
    return table


def _largest(plan: MemoryPlan) -> Table:
    table = _table("Largest live allocations at the peak")
    table.add_column("bytes", justify="right")
    table.add_column("category")
    table.add_column("shape")
    table.add_column("made by")
    for tensor in plan.live_at_peak[:NUM_TENSORS]:
        where = (
            tensor.module if tensor.module is not None else (tensor.source or "(outside modules)")
        )
        made = f"{tensor.op} in {where}" if where else tensor.op
        if tensor.step >= 0:
            made += f" ({tensor.phase}, step {tensor.step})"
        table.add_row(
            format_bytes(tensor.nbytes),
            tensor.category,
            f"{list(tensor.shape)} {tensor.dtype}",
            made,
        )
    return table


def _around(plan: MemoryPlan) -> Table:
    table = _table("The allocations leading to the peak")
    table.add_column("allocated", justify="right")
    table.add_column("reserved", justify="right")
    table.add_column("+bytes", justify="right")
    table.add_column("op")
    table.add_column("module")
    for point in plan.around_peak[-NUM_AROUND:]:
        table.add_row(
            format_bytes(point.allocated_bytes),
            format_bytes(point.reserved_bytes),
            format_bytes(point.delta_bytes),
            point.op,
            point.module or "",
        )
    return table


def _attention(plan: MemoryPlan) -> Table:
    table = _table(f"SDPA kernels the {plan.gpu.name} would run (per step)")
    table.add_column("backend")
    table.add_column("calls", justify="right")
    table.add_column("example")
    table.add_column("passed over")
    for entry in plan.attention:
        table.add_row(entry.backend, str(entry.num_calls), entry.example, "; ".join(entry.rejected))
    return table


def _whatifs(plan: MemoryPlan) -> Table:
    table = _table("What-ifs (predicted)")
    table.add_column("change")
    table.add_column("allocated", justify="right")
    table.add_column("reserved", justify="right")
    table.add_column("how")
    for whatif in plan.whatifs:
        if whatif.applicable:
            table.add_row(
                whatif.name,
                _signed(whatif.delta_allocated_bytes),
                _signed(whatif.delta_reserved_bytes),
                whatif.method,
            )
        else:
            table.add_row(whatif.name, "-", "-", f"not applicable: {whatif.note}")
    return table


def _fit(fit: FitResult) -> Group:
    # the answer is a line of its own: as the table's title it would wrap to the table's width
    answer = Text(
        f"--fit {fit.param}: largest that fits = {fit.statement()} (reserved ≤ "
        f"{format_bytes(fit.budget_bytes)}, margin {fit.margin:.0%})",
        style="table.title",
    )
    table = Table(show_edge=False, pad_edge=False, box=None)
    table.add_column(fit.param, justify="right")
    table.add_column("allocated", justify="right")
    table.add_column("reserved", justify="right")
    table.add_column("fits")
    for point in sorted(fit.curve, key=lambda p: p.value):
        table.add_row(
            str(point.value),
            format_bytes(point.peak_allocated_bytes),
            format_bytes(point.peak_reserved_bytes),
            "yes" if point.fits else "no",
        )
    return Group(answer, table)


# per-rank categories in the order a reader adds them up
_RANK_ROWS = (
    ("parameters", "parameters"),
    ("gradients", "gradients"),
    ("optimizer", "optimizer state"),
    ("other", "activations and the rest"),
    ("ddp_buckets", "DDP gradient buckets"),
    ("allgather_buffers", "FSDP all-gather buffers"),
    ("reduce_scatter_buffers", "FSDP reduce-scatter buffers"),
)


def render_per_rank(rank: dict, plan: MemoryPlan, console: Console) -> None:
    """The per-rank prediction of ``levers memory --world-size N --strategy S``."""
    budget = plan.usable_bytes * (1.0 - plan.margin)
    fits = rank["peak_reserved_bytes"] <= budget
    console.print(
        Text(
            f"Per rank · {rank['strategy']} on {rank['world_size']} ranks ({rank['method']}: from "
            f"the single-rank categories at its peak): max_memory_allocated "
            f"{format_bytes(rank['peak_allocated_bytes'])}, max_memory_reserved "
            f"{format_bytes(rank['peak_reserved_bytes'])} "
            f"({'fits' if fits else 'DOES NOT FIT'} in {format_bytes(budget)})",
            style="bold",
        )
    )
    table = Table("category", "one rank of N", "single rank", box=None)
    single = {c.category: c.nbytes for c in plan.by_category}
    single["other"] = plan.peak_allocated_bytes - sum(
        single.get(c, 0) for c in ("parameters", "gradients", "optimizer")
    )
    for key, label in _RANK_ROWS:
        if key in rank["by_category"]:
            table.add_row(
                label,
                format_bytes(rank["by_category"][key]),
                format_bytes(single[key]) if key in single else "-",
            )
    console.print(table)
    for note in rank["notes"]:
        console.print(Text(f"note: {note}", style="dim"))
