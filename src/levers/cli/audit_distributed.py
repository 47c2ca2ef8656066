"""``levers audit`` under torchrun: every rank captures its own step, rank 0 reports for all.

    torchrun --nproc_per_node=N -m levers audit WORKLOAD [--dist-timeout S] [audit options]

Each rank loads the workload (a factory that wraps its model in DDP or FSDP2 initialises its
own process group, as it would in training) and captures one step. Every rank then sends one
record (:mod:`levers.distributed.summary`), or the error its load or step raised, to rank 0
(:mod:`levers.distributed.exchange`). Rank 0 prints its own audit (summary and findings, the
scale rules included) and the merged report of all ranks, and writes ``--json``/``--md``; the
other ranks print nothing but their own errors. A rank that raised, hung or died makes every
rank exit non-zero within about twice the timeout, and rank 0 names it.

The memory model's prediction for MEM001 is skipped: it would call the factory again, which
initialises a process group that already exists.
"""

from __future__ import annotations

import argparse
import json
import sys

from levers import capture
from levers.audit.render_json import audit_to_dict, write_findings
from levers.audit.render_summary import render_summary
from levers.capture.json_io import check_writable, write_capture
from levers.cli import audit_findings as cli_findings
from levers.distributed.exchange import Gathered, RankTimeout, connect
from levers.distributed.failures import RanksFailed, rank_error
from levers.distributed.merge import DistributedReport, merge
from levers.distributed.render import markdown, render
from levers.distributed.summary import failed, summarize
from levers.distributed.world import World
from levers.errors import LeversError, StepError
from levers.loader import load_workload, parse_set
from levers.output.atomic import atomic_write_text
from levers.output.console import make_console, say_wrote
from levers.output.progress import progress_status

TAG = "audit"


def _capture(args: argparse.Namespace, world: World):
    with progress_status(enabled=None if world.is_leader else False) as progress:
        progress.say(f"loading workload {args.workload} (rank {world.rank})")
        workload = load_workload(args.workload, parse_set(args.set_items))
        progress.say(f"capturing {workload.name} (rank {world.rank} of {world.world_size})")
        result = capture.capture_step(
            workload, warmup=args.warmup, timed=args.steps, progress=progress.on_ops
        )
    return workload, result


def run(args: argparse.Namespace, world: World) -> int:
    if world.is_leader:
        _check_outputs(args)
    cli_findings.check_arguments(args)
    workload = result = error = None
    try:
        workload, result = _capture(args, world)
        record = summarize(result, world.rank, world.world_size)
    except Exception as exc:  # noqa: BLE001 - reported to rank 0 first, then raised below
        error = exc
        record = failed(world.rank, world.world_size, exc)
    exchange = connect(world, args.dist_timeout)
    gathered = exchange.gather(TAG, record.to_dict())
    if not world.is_leader:
        return _follow(exchange, world, error)
    assert gathered is not None
    report = merge(gathered.records, world.world_size, gathered.missing, gathered.timeout_s)
    exit_code = 0
    try:
        exit_code = _lead(args, report, workload, result, gathered)
    finally:
        sys.stdout.flush()  # torchrun may stop this process as soon as another rank exits
        exchange.publish(TAG, {"ok": report.ok and error is None})
    if error is not None:
        raise error
    if not report.ok:
        raise RanksFailed(
            "; ".join(report.failure_messages())
            + "; the report above shows the ranks that answered"
        )
    return exit_code


def _follow(exchange, world: World, error: BaseException | None) -> int:
    """A rank other than 0: wait for rank 0's outcome, then exit with this rank's own status."""
    try:
        outcome = exchange.outcome(TAG)
    except RankTimeout:
        if error is not None:
            raise rank_error(world, error) from None
        raise
    if error is not None:
        raise rank_error(world, error)
    # another rank failed: rank 0 has named it; this rank only exits non-zero
    return 0 if outcome.get("ok") else RanksFailed.exit_code


def _check_outputs(args: argparse.Namespace) -> None:
    for path in (args.json_path, args.findings_json_path):
        if path is not None:
            check_writable(path)


def _lead(
    args: argparse.Namespace,
    report: DistributedReport,
    workload,
    result,
    gathered: Gathered,
) -> int:
    """Rank 0: its own audit, then the merged report; writes the requested files."""
    console = make_console()
    findings = None
    if result is not None:
        render_summary(result, console, top_n=args.top)
        args.no_memory_model = True  # the factory would initialise its process group again
        findings = cli_findings.run_findings(args, result, workload, console)
    render(report, console)
    if args.json_path is not None:
        extra = {"distributed": report.to_dict()}
        if findings is not None:
            extra["audit"] = audit_to_dict(findings.report, config=findings.result.config)
            write_capture(result, args.json_path, extra=extra)
        else:
            atomic_write_text(args.json_path, json.dumps(extra, indent=1) + "\n")
        say_wrote(args.json_path, "the capture of rank 0 and the merged report")
    if args.findings_json_path is not None and findings is not None:
        write_findings(findings.report, args.findings_json_path, config=findings.result.config)
        say_wrote(args.findings_json_path, "the findings of rank 0")
    if args.md_path is not None:
        text = args.md_path.read_text() + "\n" if findings is not None else ""
        atomic_write_text(args.md_path, text + markdown(report))
        say_wrote(args.md_path, "the findings and the merged report as Markdown")
    return findings.exit_code if findings is not None else 0
