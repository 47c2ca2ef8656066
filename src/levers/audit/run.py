"""The audit of one captured step, composed: the memory model's prediction, then the rules,
then the ranked report. :class:`levers.Step` and ``levers audit`` both call :func:`audit_step`.

Before the rules run, the workload's step is predicted by the memory model
(``levers.memory.predict_memory`` on the GPU that ran, or the target's largest-memory part, with
the activation-checkpointing what-if) for the bottleneck's bound and MEM001's headroom; when
MEM001 or MEM003 runs and the workload has a ``batch_size`` parameter, levers memory's fit of it
is added. A prediction that fails is reported in one line on stderr and never fails the audit.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import levers.memory
from levers.audit.config import DEFAULT_TARGET, capture_on_gpu, predicted_memory_from_plan
from levers.audit.engine import audit
from levers.audit.options import AuditOptions
from levers.audit.peak_metric_source import function_scope
from levers.audit.report import build_report
from levers.audit.report_files import write_reports
from levers.audit.rules.registry import select_rules
from levers.capture.records import Capture
from levers.hardware import GpuSpec, gpu_from_device_name, resolve_gpu
from levers.memory.fake_failures import failure_detail, first_line, user_fix
from levers.memory.fit import fit_param
from levers.memory.options import MemoryOptions
from levers.memory.plan import FitPoint
from levers.memory.prediction import source_of
from levers.output.console import make_console
from levers.output.errors import debug_from_env

# the rules that read the memory model's what-ifs (MEM001's headroom, ATTN002's and MEM004's
# freed memory)
MEMORY_RULES = ("MEM001", "ATTN002", "MEM004")
# rules that read levers memory's fit of the batch parameter
FIT_RULES = ("MEM001", "MEM003")
BATCH_PARAM = "batch_size"
# the fit searches up to this multiple of the batch now: enough to say "raise it", and bounded
MAX_FIT_FACTOR = 16
# a failed prediction's message is cut to one line of this length
MAX_WARNING_CHARS = 200


@dataclass(frozen=True)
class AuditedStep:
    """A captured step and its audit: ``result`` (the rules' findings, priced), ``report``
    (ranked, as the terminal shows it) and ``memory`` (levers memory's prediction the rules
    read, or None)."""

    capture: Capture
    result: Any  # levers.audit.AuditResult
    report: Any  # levers.audit.report.FindingsReport
    memory: Any = None  # levers.audit.config.PredictedMemory
    claims: Any = None  # levers.tune.claims.MeasuredClaims, when the levers were measured

    @property
    def findings(self) -> tuple:
        return self.report.findings

    def write(self, directory: Any) -> dict:
        """Write audit.md, audit.html, capture.json (with the findings) and trace.json into
        ``directory`` (created if needed), each atomically; returns name -> path."""
        return write_reports(self, Path(directory))


def step_scopes(workload: Any) -> dict:
    """The step function's globals and closure, for rules that read its source (MEM002)."""
    step = getattr(workload, "step", None)
    if step is None or not hasattr(step, "__code__"):
        return {}
    key, scope = function_scope(step)
    return {key: scope}


def memory_gpu(gpu: str | GpuSpec | None, capture: Any) -> str:
    """The name of the memory model's GPU (:func:`memory_gpu_spec`)."""
    return memory_gpu_spec(gpu, capture).name


def memory_gpu_spec(gpu: str | GpuSpec | None, capture: Any) -> GpuSpec:
    """The memory model's GPU: the one that ran, on a GPU capture it knows; else ``gpu``
    (None: the default target). A ``GpuSpec`` is not looked up again."""
    if capture_on_gpu(capture):
        spec = gpu_from_device_name(str(capture.env.get("device_name", "")))
        if spec is not None:
            return spec
    return resolve_gpu(gpu or DEFAULT_TARGET, allow_budget=False, option="--gpu")


def _warn(text: str) -> None:
    make_console(stderr=True).print(f"warning: {text}", markup=False, soft_wrap=True)


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [""])[0][:MAX_WARNING_CHARS]


def _say_failed_whatifs(plan: Any) -> None:
    """One line for each what-if that could not run: MEM001 then falls back to the capture."""
    for whatif in plan.whatifs:
        if not whatif.applicable and whatif.note.startswith("failed"):
            reason = whatif.note.removeprefix("failed: ").splitlines()[0][:MAX_WARNING_CHARS]
            _warn(
                f"levers memory could not predict the {whatif.name} what-if ({reason}); MEM001 "
                "estimates its headroom from the capture"
            )


def _say_prediction_failed(exc: BaseException) -> None:
    """One line (and what the workload can change, when the fix is its own); torch's log lines
    and the traceback only under ``--debug``."""
    fix = user_fix(exc)
    if debug_from_env():
        make_console(stderr=True).print(
            failure_detail(exc).rstrip("\n"), markup=False, soft_wrap=True
        )
    _warn(
        f"levers memory could not predict the step ({first_line(exc)[:MAX_WARNING_CHARS]}); "
        "the bound is unknown and MEM001 estimates its headroom from the capture"
        + (f". To predict it, {fix}" if fix else "")
    )


def predicted_memory(
    workload: Any,
    params: dict[str, Any],
    capture: Any,
    rules: Iterable[str],
    *,
    gpu: str | GpuSpec | None = None,
    predict: Callable[[GpuSpec, bool], Any] | None = None,
) -> Any:
    """The memory model's prediction of the step (a ``PredictedMemory``), or None.

    ``workload`` is a spec or a factory, ``params`` its parameters; ``predict(gpu, whatifs)``,
    with the GPU resolved (:func:`memory_gpu_spec`), gives the MemoryPlan (default:
    ``levers.memory.predict_memory``; :class:`levers.Step` passes its own, so the plan is the
    one ``Step.memory`` returns). The bottleneck's bound and
    MEM001's headroom read it; when MEM001 or MEM003 is in ``rules`` and the workload has a
    ``batch_size`` parameter, levers memory's fit of that parameter is added (the largest batch
    that fits with the margin). None when the prediction fails; a failure is one line on
    stderr and never fails the audit.
    """
    rules = list(rules)
    # the prediction is of the GPU run: a device the audit ran on here (device=cpu) is dropped,
    # so the factory gets the GPU the model stands in for
    params = {k: v for k, v in params.items() if k != "device"}
    whatifs = any(code in rules for code in MEMORY_RULES)
    try:
        gpu = memory_gpu_spec(gpu, capture)
        if predict is None:
            # read from the package at call time, so a test's stand-in is the one called
            plan = levers.memory.predict_memory(
                workload, gpu=gpu, params=params, whatifs=whatifs
            )
        else:
            plan = predict(gpu, whatifs)
        _say_failed_whatifs(plan)
        predicted = predicted_memory_from_plan(plan)
    except Exception as exc:  # noqa: BLE001 - never fail the audit over an extra figure
        _say_prediction_failed(exc)
        return None
    batch = capture.workload_params.get(BATCH_PARAM)
    if not any(code in rules for code in FIT_RULES) or not isinstance(batch, int) or batch < 1:
        return predicted
    try:
        return with_batch_fit(workload, params, plan, predicted, batch)
    except Exception as exc:  # noqa: BLE001 - never fail the audit over an extra figure
        _warn(
            f"levers memory could not fit {BATCH_PARAM} ({type(exc).__name__}: "
            f"{_first_line(exc)}); MEM003 has no fit to report"
        )
        return predicted


def with_batch_fit(workload: Any, params: dict, plan: Any, predicted: Any, batch: int) -> Any:
    """``predicted`` with levers memory's fit of the batch parameter on the plan's GPU.

    The one fit MEM001 and MEM003 read: the plan is its first point (not predicted again), and
    the search tries the cap (``MAX_FIT_FACTOR`` times the batch now) first, so a step with room
    to spare costs one prediction; a fit that stops at the cap is "at least" the cap.
    """
    budget = int(plan.gpu.usable_bytes * (1.0 - plan.margin))
    known = FitPoint(
        batch, plan.peak_allocated_bytes, plan.peak_reserved_bytes,
        plan.peak_reserved_bytes <= budget,
    )
    # the plan's own options: its GPU, margin and steps
    options = MemoryOptions(gpu=plan.gpu, margin=plan.margin, num_steps=plan.num_steps)
    fit = fit_param(
        source_of(workload, params), options, BATCH_PARAM, start=batch,
        upper=batch * MAX_FIT_FACTOR, known=(known,),
    )
    return dataclasses.replace(
        predicted,
        batch_param=BATCH_PARAM,
        batch_now=batch,
        batch_fit=fit.best,
        fit_budget_bytes=fit.budget_bytes,
        batch_fit_cap=fit.upper if fit.stopped == "cap" else None,
        batch_fit_note=(
            f"the search stops at {MAX_FIT_FACTOR}x the batch now" if fit.stopped == "cap"
            else fit.statement().partition(" (")[2].rstrip(")")
        ),
    )


def audit_step(
    capture: Capture,
    options: AuditOptions = AuditOptions(),
    *,
    workload: Any = None,
    source: Any = None,
    params: dict[str, Any] | None = None,
    predict: Callable[[GpuSpec, bool], Any] | None = None,
    progress: Any = None,
) -> AuditedStep:
    """Audit ``capture`` with ``options``: predict its memory, run the rules, rank the findings.

    ``workload`` is the built Workload that ran (its step's source scope is read by MEM002);
    ``source`` the spec or factory it came from, with ``params``, which the memory model builds
    again under fake tensors (no memory model without one, or with ``memory_model=False``);
    ``predict`` as for :func:`predicted_memory`.

    Raises:
        ValueError: a malformed torch version in the capture.
    """
    rules = [r.code for r in select_rules(options.select, options.ignore)]
    memory = None
    if options.memory_model and source is not None:
        if progress is not None:
            progress.say("predicting the step's GPU memory (levers memory)")
        memory = predicted_memory(
            source, dict(params or {}), capture, rules, gpu=options.gpu, predict=predict
        )
    # the spec the user gave, also when the memory model (and so ``source``) is off: the
    # printed `levers ab` command must name a workload, not the capture's label
    options = options.with_workload(source if isinstance(source, str) else None)
    result = audit(capture, options, scopes=step_scopes(workload), memory=memory)
    return AuditedStep(capture, result, build_report(capture, result), memory)
