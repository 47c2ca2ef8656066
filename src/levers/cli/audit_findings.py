"""The findings part of ``levers audit``: its options, and running the rules on a capture.

    levers audit [WORKLOAD] [--gpu GPU] [--select CODES] [--ignore CODES]
                 [--fail-on low|medium|high|never] [--md FILE] [--json FILE] ...

``--select``/``--ignore`` take codes or prefixes, comma-separated or repeated (``ATTN``,
``SYNC001,MEM002``), like a linter. The exit code is 1 when a finding at or above ``--fail-on``
is reported, so the audit can gate CI.

The audit itself (the memory model's prediction, the rules, the ranked report) is
:meth:`levers.Step.audit`; this module parses its options and renders. ``--no-memory-model`` skips the prediction.

What runs the verb is imported inside its functions: ``levers --help`` loads this module and
must not import torch (:mod:`levers.cli`).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from levers.cli.options import add_gpu_argument, add_output_arguments
from levers.errors import LeversError
from levers.output.atomic import atomic_open
from levers.output.progress import progress_status

FAIL_ON = ("never", "low", "medium", "high")
EXIT_FINDINGS = 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("findings")
    add_gpu_argument(
        group,
        what="the GPU that costs and MFU are estimated for on a CPU capture (on a GPU capture, "
        "the GPU that ran)",
        older_spelling="--target",
        dest="target",  # the audit's name for it (Step.audit(target=...))
    )
    group.add_argument(
        "--target-torch",
        metavar="VERSION",
        default=None,
        help="torch version whose SDPA dispatch rules apply on a CPU capture (default: the "
        "capture's own, e.g. 2.11)",
    )
    group.add_argument(
        "--assume-dtype",
        choices=("bf16", "fp16", "fp32"),
        default=None,
        help="on a CPU capture run in float32 without autocast: the dtype the GPU run computes in "
        "(default: bf16, as the built-in workloads use bf16 autocast on a GPU)",
    )
    group.add_argument(
        "--select",
        action="append",
        default=[],
        metavar="CODES",
        help="only these rule codes or prefixes, comma-separated (e.g. ATTN,SYNC001)",
    )
    group.add_argument(
        "--ignore",
        action="append",
        default=[],
        metavar="CODES",
        help="skip these rule codes or prefixes, comma-separated",
    )
    group.add_argument(
        "--fail-on",
        choices=FAIL_ON,
        default="never",
        help="exit with 1 when a finding of this severity or higher is reported (default: never)",
    )
    add_output_arguments(group, md="the findings")
    group.add_argument(
        "--no-benchmark",
        action="store_true",
        help="on a GPU, do not microbenchmark fixes (their cost is then estimated)",
    )
    group.add_argument(
        "--no-measure",
        action="store_true",
        help="on a GPU, do not A/B the recommended levers on this step (their savings are then "
        "the estimates; measuring is the default there and takes a few runs per lever)",
    )
    group.add_argument(
        "--no-memory-model",
        action="store_true",
        help="do not predict the step's GPU memory with levers memory (MEM001's headroom is then "
        "estimated from the capture's live-bytes timeline)",
    )


def codes(values: Iterable[str]) -> list[str]:
    return [c.strip() for v in values for c in v.split(",") if c.strip()]


def audit_options(args: argparse.Namespace) -> Any:
    """The audit's options (:class:`levers.audit.options.AuditOptions`) from the command line,
    each checked.

    Raises:
        LeversError: a bad selector, GPU, torch version or dtype, with what to pass instead.
    """
    from levers.audit.options import AuditOptions

    try:
        return AuditOptions.checked(
            gpu=args.target,
            torch_version=args.target_torch,
            assume_dtype=args.assume_dtype,
            select=codes(args.select),
            ignore=codes(args.ignore),
            benchmark=not args.no_benchmark,
            memory_model=not args.no_memory_model,
            set_items=args.set_items or (),
        )
    except ValueError as exc:
        raise LeversError(str(exc)) from None


def check_arguments(args: argparse.Namespace) -> Any:
    """Fail before the capture on a bad option or output path; the audit's options, checked."""
    from levers.capture.json_io import check_writable

    options = audit_options(args)
    if args.md_path is not None:
        check_writable(args.md_path)
    return options


@dataclass(frozen=True)
class FindingsRun:
    result: Any  # levers.audit.AuditResult
    report: Any  # levers.audit.report.FindingsReport
    exit_code: int
    memory: Any = None  # levers.audit.config.PredictedMemory, when the model predicted it


def run_findings(
    args: argparse.Namespace, capture: Any, workload: Any, console: Any, step: Any = None,
    options: Any = None,
) -> FindingsRun:
    """Audit the capture through ``step`` (a :class:`levers.Step`; for a capture made elsewhere,
    :meth:`levers.Step.from_capture`) with ``options`` (what :func:`check_arguments` returned;
    None: read from ``args``), print the report, write ``--md``; the exit code follows
    ``--fail-on``."""
    from levers.audit.finding import severity_rank
    from levers.audit.render_markdown import findings_markdown
    from levers.api import Step
    from levers.audit.render_terminal import render_findings

    options = audit_options(args) if options is None else options
    if step is None:  # a capture made elsewhere (a script after --)
        step = Step.from_capture(capture, workload)
    # None: measure where the capture ran on a GPU (Step.audit decides)
    measure = False if getattr(args, "no_measure", False) else None
    try:
        with progress_status() as progress:
            audited = step.audit(progress=progress, measure=measure, options=options)
    except ValueError as exc:
        raise LeversError(str(exc)) from None
    console.print()
    render_findings(audited.report, console)
    if args.md_path is not None:
        with atomic_open(args.md_path) as f:
            f.write(findings_markdown(audited.report))
    exit_code = 0
    if args.fail_on != "never":
        threshold = severity_rank(args.fail_on)
        if any(severity_rank(f.severity) >= threshold for f in audited.result.findings):
            exit_code = EXIT_FINDINGS
    return FindingsRun(audited.result, audited.report, exit_code, audited.memory)
