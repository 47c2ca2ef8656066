"""Put a cost on each finding: measured on a GPU capture, estimated for the target otherwise.

Estimated (CPU capture): the finding's "now" parts (or the capture ops it names, re-priced for
the target GPU and the assumed dtype) and its "fixed" parts through the roofline of
:mod:`levers.audit.cost.roofline`.

Measured (GPU capture): "now" is the device time the capture joined to the ops the finding
names (forward and backward); "fixed" is a microbenchmark of the fix at the shapes seen, where
one exists, else the estimate (and the cost says so). A sync's cost is always an estimate: it is
idle time, which no kernel records. So are launch gaps' (HOST001): the gap time is measured, but
what CUDA graphs recover of it is an estimate.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from levers.capture.records import Capture
from levers.audit.config import RuleConfig
from levers.audit.cost import microbench as mb
from levers.audit.cost import roofline
from levers.audit.finding import Cost, Finding, Work
from levers.vocab import ESTIMATED, MEASURED


def estimate_basis(config: RuleConfig) -> str:
    gpu = config.gpu
    text = (
        f"roofline on {gpu.title}: {gpu.bf16_tflops:g} TFLOP/s dense bf16, {gpu.hbm_gbps:g} GB/s "
        f"HBM at {roofline.MATMUL_EFFICIENCY:.0%}/{roofline.BANDWIDTH_EFFICIENCY:.0%} efficiency, "
        f"{roofline.KERNEL_OVERHEAD_US:g} us per kernel"
    )
    if config.assumed_dtype:
        text += f"; float32 tensors assumed {config.assumed_dtype} on the GPU"
    return text


def _tf32(capture: Capture) -> bool:
    return bool(capture.settings.get("cuda_matmul_allow_tf32"))


# idle time, which no kernel records: its cost is an estimate on a GPU capture too
IDLE_KINDS = ("sync_stall", "launch_gaps")


def _idle_kind(work: Work) -> str | None:
    kind = work.bench.get("kind") if work.bench else None
    return kind if kind in IDLE_KINDS else None


def estimate_now_us(work: Work, capture: Capture, config: RuleConfig) -> float:
    if _idle_kind(work) == "sync_stall":
        return float(work.bench["stall_us"])
    if _idle_kind(work) == "launch_gaps":
        return float(work.bench["gap_us"])
    if work.now:
        return roofline.parts_us(work.now, config.gpu)
    ops = (capture.ops[i] for i in work.now_ops)
    return roofline.ops_us(
        ops, config.gpu, assumed_dtype=config.assumed_dtype, tf32=_tf32(capture)
    )


def estimate_fixed_us(
    work: Work, now_us: float, capture: Capture, config: RuleConfig
) -> float:
    if work.fixed_fraction_of_now is not None:
        return now_us * work.fixed_fraction_of_now
    extra = roofline.ops_us(
        (capture.ops[i] for i in work.fixed_extra_ops),
        config.gpu,
        assumed_dtype=config.assumed_dtype,
        tf32=_tf32(capture),
    )
    return roofline.parts_us(work.fixed, config.gpu) + extra


def _has_work(work: Work) -> bool:
    return bool(
        work.now
        or work.now_ops
        or work.fixed
        or work.fixed_extra_ops
        or work.bench
        or work.saved_bytes
    )


def estimated_cost(finding: Finding, capture: Capture, config: RuleConfig) -> Cost:
    work = finding.work
    if not _has_work(work):
        return Cost(provenance="none", now_ms=None, fixed_ms=None, basis="")
    now_us = estimate_now_us(work, capture, config)
    fixed_us = estimate_fixed_us(work, now_us, capture, config)
    calls = max(work.calls_per_step, 1)
    basis = estimate_basis(config)
    if _idle_kind(work) == "sync_stall":
        basis = (
            f"GPU idle after each sync, about {now_us / calls:g} us (one launch latency while the "
            "host refills the queue); the real cost depends on how far ahead the host was"
        )
    elif _idle_kind(work) == "launch_gaps":
        basis = _launch_gaps_basis(work.bench)
    elif work.fixed_fraction_of_now is not None and work.fixed_fraction_why:
        basis += f"; fixed = {work.fixed_fraction_of_now:.0%} of it ({work.fixed_fraction_why})"
    return Cost(
        provenance=ESTIMATED,
        now_ms=now_us / 1e3,
        fixed_ms=fixed_us / 1e3,
        saved_bytes=work.saved_bytes,
        basis=basis,
        per_call_now_ms=now_us / 1e3 / calls,
        per_call_fixed_ms=fixed_us / 1e3 / calls,
        calls_per_step=calls,
    )


def _launch_gaps_basis(bench: dict[str, Any]) -> str:
    text = (
        "launch-and-idle time of the captured step (step time minus kernel time); CUDA graphs "
        "replay the kernels with one launch, so this is what they can recover at most"
    )
    if bench.get("reasons"):
        text += "; nothing is recovered while CUDA graphs cannot apply"
    elif bench.get("partly"):
        text += "; on this step they replay only part of it (the experts' routing is skipped)"
    return text


def measured_now_us(work: Work, capture: Capture) -> float:
    return sum(capture.ops[i].device_us or 0.0 for i in work.now_ops)


def _bench_fixed_us(bench: dict[str, Any], calls: int) -> tuple[float | None, str]:
    """Microbenchmarked time of the fix for all calls of a step, and how it was obtained."""
    kind = bench.get("kind")
    if kind == "sdpa":
        t = mb.bench_sdpa(bench, bench.get("backend"))
        if not t.ok:
            return None, f"{bench.get('backend')} unavailable ({t.unavailable})"
        return (
            t.median_us * calls,
            f"SDPA on {bench.get('backend')} at the same shapes, median of {t.samples}",
        )
    if kind == "eager_attention":
        q = bench["query"]
        b, h, lq, d = q["shape"]
        spec = {
            "query": {"shape": [b, h, lq, d], "dtype": q["dtype"]},
            "key": {"shape": [b, h, q["len_k"], d], "dtype": q["dtype"]},
            "value": {"shape": [b, h, q["len_k"], d], "dtype": q["dtype"]},
            "attn_mask": {"shape": [b, 1, 1, q["len_k"]], "dtype": "bool"}
            if bench.get("has_mask")
            else None,
            "requires_grad": bench.get("requires_grad", True),
        }
        t = mb.bench_sdpa(spec, None)
        if not t.ok:
            return None, f"SDPA unavailable ({t.unavailable})"
        masked = " with the mask" if bench.get("has_mask") else ""
        return (
            t.median_us * calls,
            f"F.scaled_dot_product_attention{masked} at the same shapes, median of {t.samples}",
        )
    if kind == "norm":
        total = 0.0
        fn = (
            mb.bench_rms_norm if bench.get("norm") == "RMSNorm" else mb.bench_layer_norm
        )
        samples = 0
        for entry in bench["calls"]:
            t = fn(entry["shape"], bench["dtype"])
            if not t.ok:
                return None, f"fused norm unavailable ({t.unavailable})"
            total += t.median_us * entry["count"]
            samples = t.samples
        name = "F.rms_norm" if bench.get("norm") == "RMSNorm" else "F.layer_norm"
        return total, f"{name} at the same shapes, median of {samples}"
    if kind == "loss_rows":
        t = mb.bench_loss_rows(bench)
        if not t.ok:
            return None, f"loss benchmark unavailable ({t.unavailable})"
        what = "head matmul, cast and cross_entropy" if bench.get("head") else "cast and cross_entropy"
        return (
            t.median_us * calls,
            f"{what} over the {bench['rows']} rows with a real target, median of {t.samples}",
        )
    return None, "no benchmark for this fix"


def measured_cost(
    finding: Finding, capture: Capture, config: RuleConfig, *, benchmark: bool
) -> Cost:
    work = finding.work
    estimate = estimated_cost(finding, capture, config)
    # a sync's cost and launch gaps are idle time no kernel records; a metric has no time cost
    if estimate.provenance == "none" or _idle_kind(work):
        return estimate
    calls = max(work.calls_per_step, 1)
    now_us = measured_now_us(work, capture)
    basis = f"device time of {len(work.now_ops)} ops in the captured step"
    fixed_us: float | None
    fixed_how = MEASURED
    bench_us, how = (
        _bench_fixed_us(work.bench, calls)
        if (benchmark and work.bench)
        else (None, "benchmarks off" if work.bench else "no benchmark")
    )
    if work.fixed_fraction_of_now is not None and bench_us is not None:
        fixed_us = bench_us
        basis += f"; fixed: {how}"
    elif work.fixed_fraction_of_now is not None:
        fixed_us = now_us * work.fixed_fraction_of_now
        fixed_how = ESTIMATED
        why = work.fixed_fraction_why or "the rows that remain"
        basis += f"; fixed = {work.fixed_fraction_of_now:.0%} of it ({why}; {how})"
    elif work.fixed_extra_ops:
        fixed_us = now_us + sum(
            capture.ops[i].device_us or 0.0 for i in work.fixed_extra_ops
        )
        basis = f"recomputation = device time of {len(work.fixed_extra_ops)} forward ops in the captured step"
    elif not work.fixed and not work.bench:
        fixed_us = 0.0  # the fix removes the work
        basis += "; the fix removes these ops"
    else:
        if bench_us is None:
            fixed_us = (
                estimate.fixed_ms * 1e3 if estimate.fixed_ms is not None else None
            )
            fixed_how = ESTIMATED
            basis += f"; fixed estimated ({how}): {estimate_basis(config)}"
        else:
            fixed_us = bench_us
            basis += f"; fixed: {how}"
    return Cost(
        provenance=MEASURED,
        now_ms=now_us / 1e3,
        fixed_ms=None if fixed_us is None else fixed_us / 1e3,
        saved_bytes=work.saved_bytes,
        basis=basis,
        per_call_now_ms=now_us / 1e3 / calls,
        per_call_fixed_ms=None if fixed_us is None else fixed_us / 1e3 / calls,
        calls_per_step=calls,
        fixed_provenance=fixed_how,
    )


def price(
    findings: Iterable[Finding],
    capture: Capture,
    config: RuleConfig,
    *,
    benchmark: bool = True,
) -> list[Finding]:
    """``findings`` with ``cost`` set: measured on a GPU capture, estimated otherwise."""
    priced = []
    for finding in findings:
        if config.on_gpu:
            cost = measured_cost(finding, capture, config, benchmark=benchmark)
        else:
            cost = estimated_cost(finding, capture, config)
        priced.append(replace(finding, cost=cost))
    return priced
