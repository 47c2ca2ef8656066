"""The findings part of ``levers audit``: its options, and running the rules on a capture.

    levers audit [WORKLOAD] [--target GPU] [--select CODES] [--ignore CODES]
                 [--fail-on low|medium|high|never] [--md FILE] [--json FILE] ...

``--select``/``--ignore`` take codes or prefixes, comma-separated or repeated (``ATTN``,
``SYNC001,MEM002``), like a linter. The exit code is 1 when a finding at or above ``--fail-on``
is reported, so the audit can gate CI.

Before the rules run, the workload's step is predicted by the memory model
(``levers.memory.predict_memory`` on the GPU that ran, or the ``--target``'s largest-memory part,
with its what-ifs) for MEM001's headroom and the memory ATTN002's fix frees (the eager-to-SDPA
what-if). ``--no-memory-model`` skips it;
a prediction that fails is reported in one line on stderr and never fails the audit.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from levers.errors import LeversError

# the rules that read the memory model's what-ifs (MEM001's headroom, ATTN002's freed memory)
MEMORY_RULES = ("MEM001", "ATTN002")
# rules that read levers memory's fit of the batch parameter
FIT_RULES = ("MEM001", "MEM003")
BATCH_PARAM = "batch_size"
# the fit searches up to this multiple of the batch now: enough to say "raise it", and bounded
MAX_FIT_FACTOR = 16
# a failed prediction's message is cut to one line of this length
MAX_WARNING_CHARS = 200
FAIL_ON = ("never", "low", "medium", "high")
EXIT_FINDINGS = 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("findings")
    group.add_argument(
        "--target",
        metavar="GPU",
        default=None,
        help="GPU that costs and MFU are estimated for on a CPU capture: any name levers memory "
        "--gpu takes (h100, h100-80gb, h200, a100, a100-40gb; default: h100; on a GPU capture, "
        "the GPU that ran)",
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
    group.add_argument(
        "--no-memory-model",
        action="store_true",
        help="do not predict the step's GPU memory with levers memory (MEM001's headroom is then "
        "estimated from the capture's live-bytes timeline)",
    )


def codes(values: Iterable[str]) -> list[str]:
    return [c.strip() for v in values for c in v.split(",") if c.strip()]


def check_arguments(args: argparse.Namespace) -> None:
    """Fail before the capture on a bad selector, version or output path."""
    from levers.audit.config import parse_torch_version
    from levers.audit.rules.registry import select_rules
    from levers.capture.json_io import check_writable
    from levers.hardware import resolve_gpu

    try:
        select_rules(codes(args.select), codes(args.ignore))
        if args.target is not None:
            resolve_gpu(args.target, allow_budget=False, option="--target")
        if args.target_torch is not None:
            parse_torch_version(args.target_torch)
    except ValueError as exc:
        raise LeversError(str(exc)) from None
    if args.md_path is not None:
        check_writable(args.md_path)


@dataclass(frozen=True)
class FindingsRun:
    result: Any  # levers.audit.AuditResult
    report: Any  # levers.audit.report.FindingsReport
    exit_code: int
    memory: Any = None  # levers.audit.config.PredictedMemory, when the model predicted it


def step_scopes(workload: Any) -> dict:
    """The step function's globals and closure, for rules that read its source (MEM002)."""
    from levers.audit.peak_metric_source import function_scope

    step = getattr(workload, "step", None)
    if step is None or not hasattr(step, "__code__"):
        return {}
    key, scope = function_scope(step)
    return {key: scope}


def memory_gpu(target: str | None, capture: Any) -> str:
    """The memory model's GPU: the one that ran, on a GPU capture it knows; else ``--target``'s."""
    from levers.audit.config import DEFAULT_TARGET, capture_on_gpu
    from levers.hardware import gpu_from_device_name, resolve_gpu

    if capture_on_gpu(capture):
        spec = gpu_from_device_name(str(capture.env.get("device_name", "")))
        if spec is not None:
            return spec.name
    return resolve_gpu(target or DEFAULT_TARGET, allow_budget=False, option="--target").name


def _say_failed_whatifs(plan: Any) -> None:
    """One line for each what-if that could not run: MEM001 then falls back to the capture."""
    from levers.output.console import make_console

    for whatif in plan.whatifs:
        if not whatif.applicable and whatif.note.startswith("failed"):
            reason = whatif.note.removeprefix("failed: ").splitlines()[0][:MAX_WARNING_CHARS]
            make_console(stderr=True).print(
                f"warning: levers memory could not predict the {whatif.name} what-if "
                f"({reason}); MEM001 estimates its headroom from the capture",
                markup=False,
                soft_wrap=True,
            )


def predicted_memory(
    args: argparse.Namespace, capture: Any, rules: Iterable[str]
) -> Any:
    """The memory model's prediction of the step (a ``PredictedMemory``), or None.

    The bottleneck's bound and MEM001's headroom read it, and ATTN002 the memory its fix frees
    (the what-ifs are predicted when MEM001 or ATTN002 is selected); when MEM001 or MEM003 is
    selected and the workload has a ``batch_size`` parameter, levers memory's fit of that
    parameter is added (the largest batch that fits with the margin). None when
    ``--no-memory-model`` is given or the prediction fails; a failure is one line on stderr
    (torch's log lines and the traceback under ``--debug``) and never fails the audit.
    """
    from levers.audit.config import predicted_memory_from_plan
    from levers.loader import parse_set
    from levers.output.console import make_console

    rules = list(rules)
    if args.no_memory_model:
        return None
    # the prediction is of the GPU run: a device the audit ran on here (device=cpu) is dropped,
    # so the factory gets the GPU the model stands in for
    params = {k: v for k, v in parse_set(args.set_items).items() if k != "device"}
    try:
        from levers.memory import predict_memory

        gpu = memory_gpu(args.target, capture)
        plan = predict_memory(
            args.workload,
            gpu=gpu,
            params=params,
            whatifs=any(code in rules for code in MEMORY_RULES),
        )
        _say_failed_whatifs(plan)
        predicted = predicted_memory_from_plan(plan)
    except Exception as exc:  # noqa: BLE001 - never fail the audit over an extra figure
        _say_prediction_failed(exc, debug=_debug(args))
        return None
    batch = capture.workload_params.get(BATCH_PARAM)
    if not any(code in rules for code in FIT_RULES) or not isinstance(batch, int) or batch < 1:
        return predicted
    try:
        return with_batch_fit(args.workload, params, plan, predicted, batch)
    except Exception as exc:  # noqa: BLE001 - never fail the audit over an extra figure
        reason = (str(exc).strip().splitlines() or [""])[0][:MAX_WARNING_CHARS]
        make_console(stderr=True).print(
            f"warning: levers memory could not fit {BATCH_PARAM} ({type(exc).__name__}: "
            f"{reason}); MEM003 has no fit to report",
            markup=False,
            soft_wrap=True,
        )
        return predicted


def with_batch_fit(spec: str, params: dict, plan: Any, predicted: Any, batch: int) -> Any:
    """``predicted`` with levers memory's fit of the batch parameter on the plan's GPU."""
    import dataclasses

    from levers.memory.fit import fit_param
    from levers.memory.predict import source_of

    fit = fit_param(
        source_of(spec, params), plan.gpu, BATCH_PARAM, margin=plan.margin, start=batch,
        num_steps=plan.num_steps, upper=batch * MAX_FIT_FACTOR,
    )
    return dataclasses.replace(
        predicted,
        batch_param=BATCH_PARAM,
        batch_now=batch,
        batch_fit=fit.best,
        fit_budget_bytes=fit.budget_bytes,
    )


def _debug(args: argparse.Namespace) -> bool:
    from levers.output.errors import debug_from_env

    return bool(getattr(args, "debug", False)) or debug_from_env()


def _say_prediction_failed(exc: BaseException, *, debug: bool) -> None:
    """One line (and what the workload can change, when the fix is its own); torch's log lines
    and the traceback only under ``--debug``."""
    from levers.memory.fake_failures import failure_detail, first_line, user_fix
    from levers.output.console import make_console

    console = make_console(stderr=True)
    fix = user_fix(exc)
    line = (
        f"warning: levers memory could not predict the step ({first_line(exc)[:MAX_WARNING_CHARS]}); "
        f"the bound is unknown and MEM001 estimates its headroom from the capture"
        + (f". To predict it, {fix}" if fix else "")
    )
    if debug:
        console.print(failure_detail(exc).rstrip("\n"), markup=False, soft_wrap=True)
    console.print(line, markup=False, soft_wrap=True)


def run_findings(
    args: argparse.Namespace, capture: Any, workload: Any, console: Any
) -> FindingsRun:
    """Run the rules, print the report, write ``--md``; the exit code follows ``--fail-on``."""
    from levers.audit import audit
    from levers.audit.finding import severity_rank
    from levers.audit.rules.registry import select_rules
    from levers.output.atomic import atomic_open
    from levers.audit.report import build_report, render_findings
    from levers.audit.render_markdown import findings_markdown
    from levers.output.progress import progress_status

    try:
        rules = [r.code for r in select_rules(codes(args.select), codes(args.ignore))]
        with progress_status() as progress:
            progress.say("predicting the step's GPU memory (levers memory)")
            memory = predicted_memory(args, capture, rules)
        result = audit(
            capture,
            target=args.target,
            torch_version=args.target_torch,
            assume_dtype=args.assume_dtype,
            select=codes(args.select),
            ignore=codes(args.ignore),
            benchmark=not args.no_benchmark,
            scopes=step_scopes(workload),
            memory=memory,
            workload_spec=args.workload,
            set_items=list(args.set_items or ()),
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
    return FindingsRun(result, report, exit_code, memory)
