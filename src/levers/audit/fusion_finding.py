"""The finding FUSE001 and FUSE002 share: chains of elementwise kernels that one fused kernel
replaces, grouped by the source function that wrote them, priced forward and backward."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from levers.capture.records import Capture
from levers.audit.config import RuleConfig
from levers.audit.cost.roofline import dtype_size
from levers.audit.finding import Finding, Part, Work
from levers.audit.pattern_view import pattern_view
from levers.audit.patterns import (
    fmt_bytes,
    meta_text,
    module_pattern,
    receipt,
    sum_bytes,
    with_backward,
)
from levers.audit.patterns_fusion import Chain
from levers.audit.rules.registry import registered

# a fused kernel's passes over its output-sized tensors: forward (read inputs, write the
# output), backward (read the gradient and the saved inputs, write the input gradients)
PASSES = {"SwiGLU": (3, 5), "GeGLU": (3, 5), "RoPE": (2, 2)}


def group_chains(chains: Sequence[Chain], capture: Capture) -> list[list[Chain]]:
    """Chains grouped by the (file, function) of their anchor op, in first-seen order."""
    groups: dict[tuple, list[Chain]] = {}
    for chain in chains:
        src = capture.ops[chain.anchor].source
        key = (src.file, src.function) if src is not None else ("<unknown>", "")
        groups.setdefault(key, []).append(chain)
    return list(groups.values())


def fusion_finding(
    code: str,
    group: list[Chain],
    capture: Capture,
    config: RuleConfig,
    *,
    fix_title: str,
) -> Finding:
    """The finding of rule ``code`` (FUSE001 or FUSE002) for one group of chains."""
    fusion_rule = registered(code)
    ops = capture.ops
    backward = pattern_view(capture).backward
    first = group[0]
    kind = first.kind
    now = with_backward([i for c in group for i in c.ops], backward)
    fwd, bwd = PASSES[kind]
    fixed = []
    for c in group:
        size = dtype_size(config.compute_dtype(c.output.dtype))
        fixed.append(Part(f"fused {kind} forward", bytes=fwd * c.output.numel * size))
        fixed.append(Part(f"fused {kind} backward", bytes=bwd * c.output.numel * size))
    kernels = sum(1 for i in now if not ops[i].is_view)
    count = len(group)
    shapes = Counter(meta_text(c.output) for c in group)
    lines = [ops[c.anchor].source.line for c in group if ops[c.anchor].source is not None]
    anchor = ops[first.anchor]
    message = (
        f"{kind} written as {len(first.ops)} forward kernels "
        f"({' -> '.join(ops[i].name.split('.')[1] for i in first.ops)}), {count}x per step: "
        f"{kernels} kernels with backward moving {fmt_bytes(sum_bytes(ops[i] for i in now))}, where a "
        f"fused kernel runs {2 * count}."
    )
    return fusion_rule.finding(
        message=message,
        fix_title=fix_title,
        receipts=(
            receipt(
                anchor.source,
                module=module_pattern(ops[c.anchor].module for c in group),
                op=" -> ".join(ops[i].name.split(".")[1] for i in first.ops),
                shapes=", ".join(shapes),
                count=count,
                end_line=max(lines) if lines and max(lines) != min(lines) else None,
            ),
        ),
        effort="S",
        risk="low",
        work=Work(fixed=tuple(fixed), now_ops=now, calls_per_step=count),
        details={"levers": list(fusion_rule.levers), "kind": kind, "chains_per_step": count, "kernels": kernels},
    )
