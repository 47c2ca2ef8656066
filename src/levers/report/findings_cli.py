"""The findings part of ``levers audit``: its options, and running the rules on a capture.

    levers audit [WORKLOAD] [--target h100|h200|a100] [--select CODES] [--ignore CODES]
                 [--fail-on low|medium|high|never] [--md FILE] [--json FILE] ...

``--select``/``--ignore`` take codes or prefixes, comma-separated or repeated (``ATTN``,
``SYNC001,MEM002``), like a linter. The exit code is 1 when a finding at or above ``--fail-on``
is reported, so the audit can gate CI.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from levers.errors import LeversError

TARGETS = ("h100", "h200", "a100")
FAIL_ON = ("never", "low", "medium", "high")
EXIT_FINDINGS = 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("findings")
    group.add_argument(
        "--target",
        choices=TARGETS,
        default=None,
        help="GPU that costs and MFU are estimated for on a CPU capture (default: h100; on a GPU "
        "capture, the GPU that ran)",
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
    group.add_argument(
        "--md",
        dest="md_path",
        type=Path,
        metavar="FILE",
        help="also write the findings as Markdown to FILE",
    )
    group.add_argument(
        "--no-benchmark",
        action="store_true",
        help="on a GPU, do not microbenchmark fixes (their cost is then estimated)",
    )


def codes(values: Iterable[str]) -> list[str]:
    return [c.strip() for v in values for c in v.split(",") if c.strip()]


def check_arguments(args: argparse.Namespace) -> None:
    """Fail before the capture on a bad selector, version or output path."""
    from levers.detectors.config import parse_torch_version
    from levers.detectors.registry import select_rules
    from levers.report.capture_json import check_writable

    try:
        select_rules(codes(args.select), codes(args.ignore))
        if args.target_torch is not None:
            parse_torch_version(args.target_torch)
    except ValueError as exc:
        raise LeversError(str(exc)) from None
    if args.md_path is not None:
        check_writable(args.md_path)


@dataclass(frozen=True)
class FindingsRun:
    result: Any  # levers.detectors.AuditResult
    report: Any  # levers.report.findings.FindingsReport
    exit_code: int


def step_scopes(workload: Any) -> dict:
    """The step function's globals and closure, for rules that read its source (MEM002)."""
    from levers.detectors.peak_metric_source import function_scope

    step = getattr(workload, "step", None)
    if step is None or not hasattr(step, "__code__"):
        return {}
    key, scope = function_scope(step)
    return {key: scope}


def run_findings(
    args: argparse.Namespace, capture: Any, workload: Any, console: Any
) -> FindingsRun:
    """Run the rules, print the report, write ``--md``; the exit code follows ``--fail-on``."""
    from levers.detectors import audit
    from levers.detectors.finding import severity_rank
    from levers.report.atomic import atomic_open
    from levers.report.findings import build_report, render_findings
    from levers.report.findings_markdown import findings_markdown

    try:
        result = audit(
            capture,
            target=args.target,
            torch_version=args.target_torch,
            assume_dtype=args.assume_dtype,
            select=codes(args.select),
            ignore=codes(args.ignore),
            benchmark=not args.no_benchmark,
            scopes=step_scopes(workload),
        )
    except ValueError as exc:
        raise LeversError(str(exc)) from None
    report = build_report(capture, result)
    console.print()
    render_findings(report, console)
    if args.md_path is not None:
        with atomic_open(args.md_path) as f:
            f.write(findings_markdown(report))
    exit_code = 0
    if args.fail_on != "never":
        threshold = severity_rank(args.fail_on)
        if any(severity_rank(f.severity) >= threshold for f in result.findings):
            exit_code = EXIT_FINDINGS
    return FindingsRun(result, report, exit_code)
