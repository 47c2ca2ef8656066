"""The findings report as plain records: a step summary head, ranked findings, and what is
already right.

:func:`build_report` turns a Capture and its :class:`levers.audit.AuditResult` into plain
data (:class:`FindingsReport`), which every renderer lays out: the terminal
(:mod:`levers.audit.render_terminal`), Markdown (:mod:`levers.audit.render_markdown`), JSON
(:mod:`levers.audit.render_json`) and HTML (:mod:`levers.audit.render_html`); the words they
share are in :mod:`levers.audit.report_format`. Step figures come from
:mod:`levers.audit.summary`.

Every cost says how it was obtained: "measured" (GPU device time, GPU microbenchmark) or
"estimated" (roofline for the target GPU), and the head says which GPU the MFU is against.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from levers.capture.records import Capture
from levers.audit.engine import AuditResult
from levers.audit.cost.step import MFU_FORMULA, estimated_step_us, mfu, model_flops
from levers.audit.finding import Finding
from levers.audit.rank import MEMORY_WEIGHT, memory_weight, payoff
from levers.audit import summary
from levers.vocab import ESTIMATED, MEASURED


@dataclass(frozen=True)
class StepHead:
    """The step summary that heads the report."""

    workload: str
    params: dict
    device: str  # what the capture ran on
    gpu_title: str  # the GPU costs and MFU refer to
    on_gpu: bool
    step_s: (
        float  # median wall time of the plain steps on the capture's device (measured)
    )
    estimated_step_s: float | None  # the step on the target GPU (CPU captures)
    tokens_per_step: int | None
    tokens_per_s: float | None  # measured on the capture's device
    estimated_tokens_per_s: float | None
    model_flops: int
    mfu: float | None
    mfu_provenance: str  # "measured" or "estimated"
    mfu_formula: str
    peak_bytes: int
    peak_provenance: (
        str  # "measured" (allocator) or "tracked" (tensor storages on a CPU)
    )
    assumptions: tuple[str, ...]


@dataclass(frozen=True)
class FindingsReport:
    head: StepHead
    findings: tuple[Finding, ...]
    payoffs: tuple[float, ...]
    already_right: tuple  # AlreadyRight items
    active_codes: tuple[str, ...]
    bottleneck: Any = None  # levers.audit.bottleneck.Bottleneck
    recommendation: Any = None  # levers.audit.recommend.Recommendation


def build_head(capture: Capture, result: AuditResult) -> StepHead:
    config = result.config
    timing = summary.timing_summary(capture)
    flops = model_flops(capture)
    peak = config.gpu.peak_flops("bfloat16")
    estimated_s = None
    if config.on_gpu:
        step_mfu, how = mfu(flops, timing.median_s, peak), MEASURED
    else:
        estimated_s = estimated_step_us(capture, config) / 1e6
        step_mfu, how = mfu(flops, estimated_s, peak), ESTIMATED
    tokens = capture.tokens_per_step
    assumptions = []
    if not config.on_gpu:
        assumptions.append(
            f"CPU capture: costs and MFU are estimated for {config.gpu.title} with torch "
            f"{config.torch_version[0]}.{config.torch_version[1]} SDPA dispatch rules"
        )
        if config.assumed_dtype:
            assumptions.append(
                f"the step ran in float32 without autocast; the GPU run is assumed to compute in "
                f"{config.assumed_dtype} (--assume-dtype)"
            )
    return StepHead(
        workload=capture.workload,
        params=dict(capture.workload_params),
        device=str(capture.env.get("device_name") or capture.env.get("device", "")),
        gpu_title=config.gpu.title,
        on_gpu=config.on_gpu,
        step_s=timing.median_s,
        estimated_step_s=estimated_s,
        tokens_per_step=tokens,
        tokens_per_s=timing.tokens_per_s,
        estimated_tokens_per_s=(tokens / estimated_s)
        if tokens and estimated_s
        else None,
        model_flops=flops,
        mfu=step_mfu,
        mfu_provenance=how,
        mfu_formula=MFU_FORMULA.format(
            gpu=config.gpu.title, peak=config.gpu.bf16_tflops
        ),
        peak_bytes=capture.memory.peak_bytes,
        peak_provenance=MEASURED
        if capture.memory.source == "cuda-allocator"
        else "tracked",
        assumptions=tuple(assumptions),
    )


def build_report(capture: Capture, result: AuditResult) -> FindingsReport:
    weight = memory_weight(result.bottleneck.bound) if result.bottleneck else MEMORY_WEIGHT
    pays = tuple(
        payoff(f, step_ms=result.step_ms, peak_bytes=capture.memory.peak_bytes, weight=weight)
        for f in result.findings
    )
    return FindingsReport(
        head=build_head(capture, result),
        findings=result.findings,
        payoffs=pays,
        already_right=result.already_right,
        active_codes=result.active_codes,
        bottleneck=result.bottleneck,
        recommendation=result.recommendation,
    )
