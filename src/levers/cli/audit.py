"""``levers audit``: capture one training step, print its summary and the ranked findings.

    levers audit [WORKLOAD] [--set KEY=VALUE ...] [--json FILE] [--warmup N] [--steps N] [--top N]
                 [--gpu GPU] [--select CODES] [--ignore CODES] [--fail-on SEVERITY]
                 [--md FILE] [--findings-json FILE]

WORKLOAD defaults to the built-in ``demo``. The step summary shows where FLOPs, bytes and time
go, by phase, module and source line; ``--json`` keeps the whole capture and the findings. The
findings (see ``docs/rules.md`` and :mod:`levers.cli.audit_findings`) follow the summary.

What runs the verb is imported inside its functions: ``levers --help`` loads this module and
must not import torch (:mod:`levers.cli`).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from levers.errors import LeversError
from levers.cli import audit_findings as findings_cli
from levers.cli.options import (
    WORKLOAD_FORMS,
    add_output_arguments,
    add_set_argument,
    add_steps_argument,
    add_warmup_argument,
    add_workload_argument,
    output_path,
    positive_count,
    positive_seconds,
)
from levers.output.progress import progress_status
from levers.cli.script import (
    SCRIPT_HELP,
    SCRIPT_TIMED,
    SCRIPT_WARMUP,
    add_script_arguments,
    capture_script,
    reject_factory_arguments,
    reject_script_options,
    warn_nonfinite_loss,
)
from levers.output.console import make_console, say_wrote

DEFAULT_WORKLOAD = "demo"
DEFAULT_WARMUP = 1
DEFAULT_TIMED = 3
DEFAULT_TOP = 5
DEFAULT_DIST_TIMEOUT_S = 300.0


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "audit",
        help="capture one training step, show where its time, FLOPs and bytes go, and what to fix first",
        description=(
            "Run a workload's training step under capture (after warm-up) and print the step "
            "summary: FLOPs, bytes, wall time, tokens/s and peak memory, by phase, module and "
            "source line; then the findings of the detector rules (docs/rules.md), ranked by "
            "payoff, and what is already right."
        ),
        epilog=(
            f"WORKLOAD is {WORKLOAD_FORMS}. Put WORKLOAD before --set, which takes every KEY=VALUE "
            "after it: levers audit hf --set arch=llama attn=eager. " + SCRIPT_HELP
        ),
    )
    add_workload_argument(parser, help=f"{WORKLOAD_FORMS} (default: {DEFAULT_WORKLOAD})")
    add_set_argument(parser)
    add_warmup_argument(
        parser, default=f"{DEFAULT_WARMUP}; for a script after --, {SCRIPT_WARMUP}"
    )
    add_steps_argument(
        parser,
        default=f"{DEFAULT_TIMED}, for the wall time per step; for a script after --, "
        f"{SCRIPT_TIMED}",
        older_spelling="--timed",
    )
    parser.add_argument(
        "--top",
        type=positive_count,
        default=DEFAULT_TOP,
        metavar="N",
        help=f"rows in each top-N table (default: {DEFAULT_TOP})",
    )
    add_output_arguments(
        parser,
        json="the whole capture (schema levers.capture/1) with its findings (key \"audit\", "
        "schema levers.audit/1)",
        html="the report",
    )
    parser.add_argument(
        "--findings-json",
        dest="findings_json_path",
        type=output_path,
        metavar="FILE",
        help="also write the findings report (schema levers.audit/1) to FILE as JSON",
    )
    parser.add_argument(
        "--trace",
        dest="trace_path",
        type=output_path,
        metavar="FILE",
        help="also write the captured step as a Chrome/Perfetto trace (JSON; open it in "
        "ui.perfetto.dev or chrome://tracing)",
    )
    parser.add_argument(
        "--dist-timeout",
        type=positive_seconds,
        default=None,  # None: not given (a script after -- refuses it; a factory's takes the default)
        metavar="S",
        help="under torchrun: seconds rank 0 waits for the other ranks' records, and they for "
        f"its outcome, before naming the rank that did not answer (default: {DEFAULT_DIST_TIMEOUT_S:g})",
    )
    findings_cli.add_arguments(parser)
    add_script_arguments(parser)
    parser.set_defaults(func=run)
    return parser


def _reject_distributed_options(args: argparse.Namespace) -> None:
    """A script after -- is audited by each rank on its own (under torchrun too): refuse what
    only the ranks of a factory's audit use, do not ignore it."""
    if args.dist_timeout is not None:
        raise LeversError(
            "--dist-timeout is how long the ranks of a factory's audit under torchrun wait for "
            "each other while rank 0 merges their captures; a script after -- is audited by each "
            "rank on its own, and no rank waits for another's capture. Drop --dist-timeout, or "
            "audit a factory under torchrun (torchrun --nproc_per_node=N -m levers audit "
            "path/to/file.py:factory --dist-timeout S)"
        )


def run(args: argparse.Namespace) -> int:
    # imported here so that `levers --help` stays fast and works without a working torch
    from levers.api import Step
    from levers.loader import parse_set
    from levers.capture.json_io import check_writable
    from levers.distributed.world import world_from_env

    script = getattr(args, "script_command", None) is not None
    if script:
        reject_factory_arguments(args, "audit")
        _reject_distributed_options(args)
        args.no_memory_model = True  # the memory model builds a workload from a factory
    else:
        reject_script_options(args, "audit")
    args.workload = args.workload or DEFAULT_WORKLOAD
    if not script:  # a script's defaults differ, and its runner reads them itself
        args.warmup = DEFAULT_WARMUP if args.warmup is None else args.warmup
        args.steps = DEFAULT_TIMED if args.steps is None else args.steps
    world = world_from_env()
    if world.is_distributed and not script:
        # under torchrun: every rank captures, rank 0 merges (levers.cli.audit_distributed)
        from levers.cli import audit_distributed as distributed_audit

        if args.dist_timeout is None:
            args.dist_timeout = DEFAULT_DIST_TIMEOUT_S
        return distributed_audit.run(args, world)
    params = parse_set(args.set_items)
    if args.json_path is not None:
        check_writable(args.json_path)  # before the capture, not after minutes of it
    for path in (args.findings_json_path, args.trace_path, args.html_path):
        if path is not None:
            check_writable(path)
    options = findings_cli.check_arguments(args)
    if script:
        return capture_script(
            args,
            warmup=SCRIPT_WARMUP if args.warmup is None else args.warmup,
            timed=SCRIPT_TIMED if args.steps is None else args.steps,
            report=lambda ran: _report(args, ran.capture, ran.workload, step=None, options=options),
        )
    with progress_status() as progress:
        progress.say(f"loading workload {args.workload}")
        step = Step(args.workload, params)
        workload = step.workload()
        progress.say(f"capturing {workload.name}")
        result = step.capture(
            warmup=args.warmup,
            timed=args.steps,
            progress=progress.on_ops,
        )
    return _report(args, result, workload, step=step, options=options)


def _report(
    args: argparse.Namespace, result: Any, workload: Any, *, step: Any, options: Any
) -> int:
    """Print the audit of the captured step (``options``: the audit's, checked before the
    capture) and write the files asked for; the findings' exit code (``--fail-on``)."""
    from levers.audit.render_json import audit_to_dict, write_findings
    from levers.audit.render_summary import render_summary
    from levers.capture.json_io import write_capture

    warn_nonfinite_loss(result)
    console = make_console()
    render_summary(result, console, top_n=args.top)
    findings = findings_cli.run_findings(
        args, result, workload, console, step=step, options=options
    )
    if args.json_path is not None:
        audit = audit_to_dict(findings.report, config=findings.result.config)
        write_capture(result, args.json_path, extra={"audit": audit})
        say_wrote(args.json_path, "the capture")
    if args.findings_json_path is not None:
        write_findings(findings.report, args.findings_json_path, config=findings.result.config)
        say_wrote(args.findings_json_path, "the findings")
    if args.md_path is not None:
        say_wrote(args.md_path, "the findings as Markdown")
    if args.trace_path is not None:
        from levers.audit.render_trace import write_trace

        write_trace(result, args.trace_path)
        say_wrote(args.trace_path, "the trace")
    if args.html_path is not None:
        from levers.audit.render_html import write_html

        write_html(
            result, findings.report, args.html_path, config=findings.result.config,
            memory=findings.memory,
        )
        say_wrote(args.html_path, "the HTML report")
    return findings.exit_code
