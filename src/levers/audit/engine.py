"""Run the rules on a Capture: findings priced and ranked, and what is already right.

    result = audit(capture, AuditOptions.checked(gpu="h100", select=["ATTN"], ignore=["MEM002"]))

On a GPU capture costs are measured (microbenchmarks of fixes run on the current device unless
``benchmark=False``); on a CPU capture they are estimated for the options' GPU.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from levers.capture.records import Capture
from levers.audit.already_right import already_right
from levers.audit.bottleneck import Bottleneck, step_bottleneck
from levers.audit.config import PredictedMemory, RuleConfig, capture_on_gpu, make_config
from levers.audit.options import AuditOptions
from levers.audit.cost.price import price
from levers.audit.cost.step import estimated_step_us
from levers.audit.finding import AlreadyRight, Finding
from levers.audit.rank import cap_severity, memory_weight, rank
from levers.audit.recommend import Recommendation, recommend
from levers.audit.rules.registry import run_rules, select_rules
from levers.vocab import ESTIMATED, MEASURED


@dataclass(frozen=True)
class AuditResult:
    config: RuleConfig
    findings: tuple[Finding, ...]  # priced, highest payoff first
    already_right: tuple[AlreadyRight, ...]
    active_codes: tuple[str, ...]
    step_ms: float  # what payoffs are shares of: measured on a GPU, estimated for the target on a CPU
    step_provenance: str  # "measured" or "estimated"
    bottleneck: Bottleneck | None = None  # memory- or throughput-bound; the step by op class
    recommendation: Recommendation | None = None  # the lever stack and the `levers ab` that proves it


def _cudnn_version(on_gpu: bool) -> int | None:
    if not on_gpu:
        return None

    try:
        return int(torch.backends.cudnn.version() or 0) or None
    except (RuntimeError, TypeError, ValueError):
        return None


def audit(
    capture: Capture,
    options: AuditOptions = AuditOptions(),
    *,
    scopes: Mapping[tuple[str, str], Mapping[str, Any]] | None = None,
    memory: PredictedMemory | None = None,
) -> AuditResult:
    """Findings of the rules ``options`` selects on ``capture``, priced and ranked.

    ``scopes`` are the step function's source scopes (MEM002 reads them); ``memory`` is the
    memory model's prediction of the step (see
    :func:`levers.audit.config.predicted_memory_from_plan`); MEM001 takes its headroom from
    it, and from the capture's live-bytes timeline when it is None; the bottleneck takes the
    bound from it.

    Raises:
        ValueError: a malformed torch version in the capture.
    """
    rules = select_rules(options.select, options.ignore)
    config = make_config(
        capture,
        options,
        cudnn_version=_cudnn_version(capture_on_gpu(capture)),
        scopes=scopes,
        memory=memory,
    )
    findings = list(run_rules(capture, config, rules))
    priced = price(findings, capture, config, benchmark=options.benchmark)
    if config.on_gpu:
        step_ms, how = capture.timing.median_s * 1e3, MEASURED
    else:
        step_ms, how = estimated_step_us(capture, config) / 1e3, ESTIMATED
    bottleneck = step_bottleneck(capture, config)
    ranked = rank(
        cap_severity(priced, step_ms=step_ms),
        step_ms=step_ms,
        peak_bytes=capture.memory.peak_bytes,
        weight=memory_weight(bottleneck.bound),
    )
    codes = tuple(r.code for r in rules)
    right = already_right(capture, config, {f.code for f in ranked}, codes)
    stack = recommend(
        ranked,
        capture,
        step_ms=step_ms,
        weight=memory_weight(bottleneck.bound),
        workload_spec=options.workload_spec,
        set_items=options.set_items,
        on_gpu=config.on_gpu,
        gpu=config.gpu.name,
    )
    return AuditResult(
        config, tuple(ranked), tuple(right), codes, step_ms, how, bottleneck, stack
    )
