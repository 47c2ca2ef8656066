"""ATTN001 sdpa-math-fallback: an SDPA call runs the MATH backend, or a slower one than it could.

## What it does
Finds calls to `torch.nn.functional.scaled_dot_product_attention` that run (on a GPU capture)
or would run (on a CPU capture, for `--gpu` and the torch version) the unfused MATH backend,
or a fused backend slower than one the call is eligible for. For each faster backend it says why
that backend was ruled out: a dense `attn_mask` rules out FLASH; `enable_gqa` with fewer
key/value heads rules out EFFICIENT on torch 2.11-2.13; an `sdpa_kernel` pin that leaves a
backend out; fp32 inputs; head_dim limits; dropout resolution; deterministic mode.

## Why is this bad?
MATH materialises the [B, H, Lq, Lk] score matrix in fp32 several times, repeats key/value heads
for grouped-query attention and keeps the probabilities for backward. A fused kernel (cuDNN,
flash) reads q, k and v once. At training shapes the difference is an order of magnitude per
call, and it repeats in every layer, forward and backward.

## Example
```python
with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=dense_mask, enable_gqa=True)
```

Use instead:
```python
with sdpa_kernel([SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION,
                  SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH], set_priority=True):
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=dense_mask, enable_gqa=True)
```

## Fix
Admit the eligible fused backend in the pin (lever `sdpa-cudnn-backend`, which re-admits the
fused backends a pin or a mask with GQA left on MATH). Where MATH ranks
ahead of cuDNN in PyTorch's order (GPUs other than sm90/sm100, or an older cuDNN), pass
`set_priority=True` with cuDNN first. Where no fused backend is eligible, the message names what
to change: bf16 autocast for fp32 inputs, `is_causal=True` instead of a causal dense mask, or
repeating key/value heads so EFFICIENT accepts the call.

## Fix safety
Changes numerics within attention's usual tolerance: fused kernels accumulate in a different
order than MATH, which also upcasts to fp32. Check a step's loss and gradients before and after.

## Known problems
The dispatch model covers the checks dense training calls meet (dtype, mask, GQA, head_dim,
causal with Lq != Lk, dropout, deterministic mode), not strides or nested tensors. On a CPU
capture the cuDNN version is unknown and assumed recent enough to be preferred on sm90, and a
float32 CPU run is assumed to run in bf16 on the GPU (`--assume-dtype`). A GPU capture reports
the backend that ran, so it is not affected by either assumption.

## References
- PyTorch, `aten/src/ATen/native/transformers/cuda/sdp_utils.cpp` (backend checks and order)
- https://pytorch.org/docs/stable/generated/torch.nn.attention.sdpa_kernel.html
- pytorch/pytorch#191085 (GQA for memory-efficient attention)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

from levers.capture.records import CallRecord, Capture
from levers.audit import sdpa_backends as sb
from levers.audit.attention_work import (
    AttnShape,
    fused_parts,
    math_parts,
    scores_saved_bytes,
)
from levers.audit.config import RuleConfig
from levers.audit.finding import AlreadyRight, Finding, Work
from levers.audit.pattern_view import pattern_view
from levers.audit.patterns import (
    group_by_source,
    meta_text,
    module_pattern,
    receipt,
    with_backward,
)
from levers.audit.rules.registry import registered, rule
from levers.vocab import CHANGES_NUMERICS

CODE, NAME = "ATTN001", "sdpa-math-fallback"
_LEVERS = {
    sb.CUDNN: "sdpa-cudnn-backend",
    # one lever re-admits every fused backend the pin or the mask excluded
    sb.FLASH: "sdpa-cudnn-backend",
    sb.EFFICIENT: "sdpa-cudnn-backend",
}


def already_right(capture: Capture, config: RuleConfig) -> AlreadyRight | None:
    """The backends the SDPA calls run (or would run on the target GPU)."""
    calls = [c for c in capture.calls if c.kind == "sdpa" and c.args.get("query")]
    if not calls:
        return None
    ran = Counter(backend_choice(c, capture, config)[0] for c in calls)
    verb = "run" if config.on_gpu else f"would run on {config.gpu.title}"
    return AlreadyRight(
        "ATTN001",
        "fused attention backend",
        f"{len(calls)} SDPA calls {verb}: "
        + ", ".join(f"{b} x{n}" for b, n in sorted(ran.items())),
    )


@rule(
    CODE, NAME, severity="high", fix_safety=CHANGES_NUMERICS, levers=("sdpa-cudnn-backend",),
    already_right=(already_right,),
)
def check(capture: Capture, config: RuleConfig) -> Iterator[Finding]:
    calls = [c for c in capture.calls if c.kind == "sdpa" and c.args.get("query")]
    # no attention through SDPA: nothing to check
    if not calls:
        return
    backward = pattern_view(capture).backward
    groups = group_by_source(calls, lambda c: c.source)
    for group in groups.values():
        for same in _by_signature(group):
            finding = _finding(same, capture, config, backward)
            if finding is not None:
                yield finding


def _signature(call: CallRecord) -> tuple:
    a = call.args
    return (
        str(a.get("query")),
        str(a.get("key")),
        str(a.get("attn_mask")),
        a.get("is_causal"),
        a.get("enable_gqa"),
        tuple(a.get("backends_enabled") or ()),
        a.get("backend_ran"),
    )


def _by_signature(calls: list[CallRecord]) -> list[list[CallRecord]]:
    groups: dict[tuple, list[CallRecord]] = {}
    for call in calls:
        groups.setdefault(_signature(call), []).append(call)
    return list(groups.values())


def backend_choice(
    call: CallRecord, capture: Capture, config: RuleConfig
) -> tuple[str, sb.Choice, str]:
    """(backend that runs or would run, the dispatch model's choice, the compute dtype)."""
    dtype = config.compute_dtype(call.args["query"]["dtype"])
    choice = sb.choose(
        call.args,
        sm=config.gpu.sm,
        torch_version=config.torch_version,
        dtype=dtype,
        cudnn_version=config.cudnn_version,
        deterministic=bool(capture.settings.get("deterministic_algorithms")),
    )
    ran = str(call.args.get("backend_ran") or "") if config.on_gpu else choice.backend
    return ran, choice, dtype


def _finding(
    calls: list[CallRecord],
    capture: Capture,
    config: RuleConfig,
    backward: Mapping[int, Sequence[int]],
) -> Finding | None:
    call = calls[0]
    ran, choice, dtype = backend_choice(call, capture, config)
    # a call on a device other than the GPU (a CPU tensor in a GPU step): not a CUDA dispatch
    if config.on_gpu and not str(call.args["query"]["device"]).startswith("cuda"):
        return None
    # MATH with a disabled backend set only happens when every backend errors: nothing to say
    if ran not in sb.SPEED:
        return None
    faster = choice.faster_eligible(ran)
    # a fused backend runs and none faster is eligible: already right
    if ran != sb.MATH and not faster:
        return None
    best = max(faster, key=lambda b: (sb.SPEED[b], b == sb.CUDNN)) if faster else None
    shape = _attn_shape(call, dtype)
    tf32 = bool(capture.settings.get("cuda_matmul_allow_tf32"))
    now = (
        math_parts(shape, tf32=tf32)
        if ran == sb.MATH
        else fused_parts(shape, label=ran, slowdown=_slowdown(ran))
    )
    fixed = (
        fused_parts(shape, label=best or ran, slowdown=_slowdown(best or ran))
        if best
        else now
    )
    op_indices = [
        i
        for c in calls
        if c.first_op is not None
        for i in range(c.first_op, c.last_op + 1)
    ]
    count = len(calls)
    return registered(CODE).finding(
        message=_message(call, ran, choice, config, dtype, count),
        fix_title=_fix_title(choice, best, ran),
        receipts=(
            receipt(
                call.source,
                module=module_pattern(c.module for c in calls),
                op="scaled_dot_product_attention",
                shapes=_shapes_text(call),
                count=count,
            ),
        ),
        severity="high" if ran == sb.MATH else "medium",
        effort="S" if best else "M",
        risk="medium",
        lever=_LEVERS.get(best) if best else None,
        work=Work(
            now=_times(now, count),
            fixed=_times(fixed, count),
            now_ops=with_backward(op_indices, backward),
            calls_per_step=count,
            bench=_bench(call, best, ran) if best else None,
            saved_bytes=count * scores_saved_bytes(shape)
            if ran == sb.MATH and best
            else 0,
        ),
        details={
            "backend": ran,
            "best_eligible": best,
            "ruled_out": {
                b: _why_not(b, choice) for b in sb.FUSED if _why_not(b, choice)
            },
            "order": list(choice.order),
            "backends_enabled": list(call.args.get("backends_enabled") or ()),
        },
    )


def _slowdown(backend: str) -> float:
    # memory-efficient attention reaches roughly two thirds of flash's throughput
    return 1.5 if backend == sb.EFFICIENT else 1.0


def _times(parts: tuple, count: int) -> tuple:
    return tuple(
        replace(
            p,
            flops=p.flops * count,
            bytes=p.bytes * count,
            num_kernels=p.num_kernels * count,
        )
        for p in parts
    )


def _attn_shape(call: CallRecord, dtype: str) -> AttnShape:
    q, k = call.args["query"]["shape"], call.args["key"]["shape"]
    batch = 1
    for d in q[:-3]:
        batch *= d
    return AttnShape(
        batch=batch,
        heads_q=q[-3] if len(q) >= 3 else 1,
        heads_kv=k[-3] if len(k) >= 3 else 1,
        len_q=q[-2],
        len_k=k[-2],
        head_dim=q[-1],
        dtype=dtype,
        has_mask=call.args.get("attn_mask") is not None,
        is_causal=bool(call.args.get("is_causal")),
        requires_grad=bool(call.args.get("requires_grad", True)),
    )


def _why_not(backend: str, choice: sb.Choice) -> str:
    if backend in choice.ruled_out:
        return choice.ruled_out[backend]
    if backend in choice.pinned_out:
        return "eligible, but the sdpa_kernel pin at the call leaves it out"
    if backend in choice.outranked:
        return "eligible, but it ranks after MATH in this torch's priority order"
    return ""


def _where(config: RuleConfig) -> str:
    where = (
        f"{config.gpu.title}, torch {config.torch_version[0]}.{config.torch_version[1]}"
    )
    if config.on_gpu:
        return where
    return where + (
        f"; CPU capture, inputs assumed {config.assumed_dtype}"
        if config.assumed_dtype
        else "; CPU capture"
    )


def _message(
    call: CallRecord,
    ran: str,
    choice: sb.Choice,
    config: RuleConfig,
    dtype: str,
    count: int,
) -> str:
    verb = "runs" if config.on_gpu else "would run"
    a = call.args
    facts = []
    if a.get("attn_mask") is not None:
        facts.append(f"dense mask {meta_text(a['attn_mask'])}")
    if a.get("is_causal"):
        facts.append("is_causal")
    if a.get("enable_gqa"):
        facts.append("enable_gqa")
    pins = a.get("backends_enabled") or []
    if len(pins) < 4:
        facts.append("pinned to [" + ", ".join(pins) + "]")
    head = (
        f"SDPA {verb} {ran} ({_where(config)}), {count}x per step: "
        f"q {meta_text(a['query'])}, k/v {meta_text(a['key'])}"
        + (f", {', '.join(facts)}" if facts else "")
        + "."
    )
    ruled = [
        f"{b}: {_why_not(b, choice)}"
        for b in sb.FUSED
        if sb.SPEED[b] > sb.SPEED.get(ran, 0) and _why_not(b, choice)
    ]
    return head + (" " + " ".join(f"{r}." for r in ruled) if ruled else "")


def _fix_title(choice: sb.Choice, best: str | None, ran: str) -> str:
    if best is not None and best in choice.pinned_out:
        title = f"Admit SDPBackend.{best} in the sdpa_kernel pin, first in the list"
        if sb.MATH in choice.order and choice.order.index(best) > choice.order.index(
            sb.MATH
        ):
            title += ", with set_priority=True so it ranks ahead of MATH"
        return title
    if best is not None:
        return (
            f"Put SDPBackend.{best} ahead of MATH: "
            f"sdpa_kernel([SDPBackend.{best}, ...], set_priority=True)"
        )
    steps = []
    reasons = " ".join(choice.ruled_out.values())
    if "fp16/bf16" in reasons:
        steps.append("run attention in bf16 (torch.autocast)")
    if "grouped-query" in reasons:
        steps.append(
            "repeat key/value heads to the query heads so EFFICIENT accepts the mask"
        )
    if "attn_mask" in reasons:
        steps.append("use is_causal=True if the dense mask is only causal")
    if not steps:
        steps.append("change the call so a fused backend is eligible (see the reasons)")
    text = "; or ".join(steps)
    return text[0].upper() + text[1:]


def _shapes_text(call: CallRecord) -> str:
    a = call.args
    text = (
        f"q {meta_text(a['query'])}, k {meta_text(a['key'])}, v {meta_text(a['value'])}"
    )
    if a.get("attn_mask") is not None:
        text += f", mask {meta_text(a['attn_mask'])}"
    return text


def _bench(call: CallRecord, best: str, ran: str) -> dict[str, Any]:
    a = call.args
    return {
        "kind": "sdpa",
        "query": a["query"],
        "key": a["key"],
        "value": a["value"],
        "attn_mask": a.get("attn_mask"),
        "is_causal": bool(a.get("is_causal")),
        "dropout_p": float(a.get("dropout_p") or 0.0),
        "scale": a.get("scale"),
        "enable_gqa": bool(a.get("enable_gqa")),
        "requires_grad": bool(a.get("requires_grad", True)),
        "backend": best,
        "now_backend": ran,
    }
