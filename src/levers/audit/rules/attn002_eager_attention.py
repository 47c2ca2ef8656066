"""ATTN002 eager-attention: attention written as matmul, softmax, matmul, materialising scores.

## What it does
Finds attention computed by hand: a matmul (or einsum) that writes [.., Lq, Lk] scores, then a
softmax (often after scaling, a mask and an fp32 upcast), then a matmul with the values. It
reports the bytes of score-sized tensors written per step, whether the scores are upcast to fp32,
and whether the call is flash-eligible as written (no mask, equal head dims <= 256).

The memory the fix frees is **predicted by levers memory** when the audit has the memory
model's prediction of the step (`levers audit` makes one unless `--no-memory-model`) and the
model has a switch to SDPA (a Hugging Face model's attention implementation, timm's
`fused_attn`): the drop of the predicted allocated peak when the workload is predicted again
with that switch turned (the `sdpa-attention` what-if). Otherwise it is **estimated** as the
fp32 probabilities each call keeps for backward, which leaves out the other score-sized
tensors live at the peak; the finding says which.

## Why is this bad?
Every intermediate of the score matrix goes to HBM and back: the scores, the scaled and masked
scores, an fp32 copy, the probabilities, their cast back, and the probabilities are kept for
backward. A fused SDPA kernel computes the same thing on chip, reading q, k and v once. Under
bf16 autocast an explicit upcast before the softmax does not even buy fp32 scores: the score
matmul itself already ran in bf16.

## Example
```python
scores = torch.einsum("bhqe,bhke->bhqk", q * scale, k)
probs = scores.float().softmax(dim=-1).to(q.dtype)
out = torch.einsum("bhqk,bhke->bhqe", probs, v)
```

Use instead:
```python
out = F.scaled_dot_product_attention(q, k, v)
```

## Fix
Replace the chain with `F.scaled_dot_product_attention` (lever `sdpa-attention`), passing the mask as `attn_mask` (or `is_causal=True`); keep the eager path as the parity
reference while switching.

## Fix safety
Changes numerics: the fused kernel's softmax accumulates in fp32 on chip in a different order.
Compare a step's loss and gradients with a tolerance.

## Known problems
The pattern is matched by shapes and adjacency (no tensor identities are recorded): a softmax
over a [.., Lq, Lk] tensor between two matmuls of the same module that write and read that many
elements. Attention split across modules, or with more than 48 ops between the matmuls and the
softmax, is missed. Whether a mask is all-True (and could be dropped) is not known.

## References
- https://pytorch.org/docs/stable/generated/torch.nn.functional.scaled_dot_product_attention.html
- Dao et al., FlashAttention (2022), https://arxiv.org/abs/2205.14135
"""

from __future__ import annotations

from collections.abc import Iterator

from levers.capture.records import Capture
from levers.audit.attention_work import AttnShape, fused_parts, scores_saved_bytes
from levers.audit.config import PredictedMemory, RuleConfig
from levers.audit.finding import AlreadyRight, Finding, Work
from levers.audit.pattern_view import pattern_view
from levers.audit.patterns import (
    fmt_bytes,
    group_by_source,
    meta_text,
    module_pattern,
    receipt,
    with_backward,
)
from levers.audit.patterns_attention import AttentionChain
from levers.audit.rules.registry import registered, rule
from levers.vocab import CHANGES_NUMERICS

CODE, NAME = "ATTN002", "eager-attention"
# how the memory the fix frees was obtained (the finding's details say which)
PREDICTED, ESTIMATED = "levers memory", "score shapes"


def already_right(capture: Capture, config: RuleConfig) -> AlreadyRight | None:
    """Attention that goes through SDPA."""
    n = sum(1 for c in capture.calls if c.kind == "sdpa")
    if not n:
        return None
    return AlreadyRight(
        "ATTN002",
        "attention through SDPA",
        f"{n} scaled_dot_product_attention calls; no materialised score matrices",
    )


@rule(
    CODE, NAME, severity="high", fix_safety=CHANGES_NUMERICS, levers=("sdpa-attention",),
    already_right=(already_right,),
)
def check(capture: Capture, config: RuleConfig) -> Iterator[Finding]:
    view = pattern_view(capture)
    chains = view.eager_attention
    # no hand-written attention in the forward pass
    if not chains:
        return
    backward = view.backward
    ops = capture.ops
    groups = list(group_by_source(chains, lambda c: ops[c.first_matmul].source).values())
    estimates = [_estimated_freed_bytes(group, config) for group in groups]
    freed = _freed_bytes(estimates, config.memory)
    for group, (freed_bytes, freed_text) in zip(groups, freed):
        yield _finding(group, capture, config, backward, freed_bytes, freed_text)


def _estimated_freed_bytes(group: list[AttentionChain], config: RuleConfig) -> int:
    first = group[0]
    shape = _shape(first, config.compute_dtype(first.query.dtype))
    return len(group) * scores_saved_bytes(shape)


def _freed_bytes(
    estimates: list[int], memory: PredictedMemory | None
) -> list[tuple[int, str]]:
    """(bytes freed at the peak, how that figure was obtained) for each attention site.

    The memory model predicts the whole step with every eager attention switched, so its drop
    of the allocated peak is shared among the sites in proportion to their estimates.
    """
    if memory is None or not memory.sdpa_applicable:
        why = (
            "no memory-model prediction"
            if memory is None
            else (memory.sdpa_note.strip().splitlines() or ["not predicted"])[0]
        )
        text = (
            "estimated from the fp32 probabilities kept for backward (levers memory did not "
            f"predict the fix: {why})"
        )
        return [(estimate, text) for estimate in estimates]
    total = max(-memory.sdpa_delta_allocated_bytes, 0)
    text = (
        f"predicted by levers memory for {memory.gpu} ({memory.sdpa_note}: the allocated peak "
        f"{fmt_bytes(memory.peak_allocated_bytes)} -> "
        f"{fmt_bytes(memory.peak_allocated_bytes + memory.sdpa_delta_allocated_bytes)}, reserved "
        f"{fmt_bytes(memory.peak_reserved_bytes)} -> "
        f"{fmt_bytes(memory.peak_reserved_bytes + memory.sdpa_delta_reserved_bytes)})"
    )
    weight = sum(estimates)
    shares = [total * e // weight if weight else 0 for e in estimates]
    shares[-1] += total - sum(shares)  # the rounding remainder, so the shares add up
    return [(share, text) for share in shares]


def _shape(chain: AttentionChain, dtype: str) -> AttnShape:
    scores = chain.scores.shape
    batch_heads = 1
    for d in scores[:-2]:
        batch_heads *= d
    heads = scores[-3] if len(scores) >= 4 else 1
    return AttnShape(
        batch=batch_heads // heads,
        heads_q=heads,
        heads_kv=heads,
        len_q=scores[-2],
        len_k=scores[-1],
        head_dim=chain.query.shape[-1],
        dtype=dtype,
        has_mask=chain.has_mask,
    )


def flash_eligibility(chain: AttentionChain, dtype: str) -> tuple[bool, list[str]]:
    """(flash-eligible as written, what stands in the way)."""
    blockers = []
    if chain.has_mask:
        blockers.append(
            "a mask is applied to the scores (FLASH takes none; EFFICIENT and cuDNN do)"
        )
    head_dim, head_dim_v = chain.query.shape[-1], chain.value.shape[-1]
    if head_dim != head_dim_v or head_dim > 256:
        blockers.append(
            f"head_dim {head_dim}/{head_dim_v} (FLASH needs equal head dims <= 256)"
        )
    if dtype not in ("bfloat16", "float16"):
        blockers.append(f"{dtype} inputs (fused kernels need fp16/bf16)")
    return not blockers, blockers


def _finding(
    group: list[AttentionChain],
    capture: Capture,
    config: RuleConfig,
    backward,
    freed_bytes: int,
    freed_text: str,
) -> Finding:
    ops = capture.ops
    first = group[0]
    m1 = ops[first.first_matmul]
    dtype = config.compute_dtype(first.query.dtype)
    shape = _shape(first, dtype)
    eligible, blockers = flash_eligibility(first, dtype)
    count = len(group)
    written = sum(c.scores_written_bytes for c in group)
    chain_ops = [i for c in group for i in c.ops]
    last_lines = [
        ops[c.second_matmul].source.line for c in group if ops[c.second_matmul].source
    ]
    upcast = any(c.upcast for c in group)
    steps = ["matmul", "softmax" + (" (fp32)" if upcast else ""), "matmul"]
    if first.has_mask:
        steps.insert(1, "mask")
    message = (
        f"Attention written as {' -> '.join(steps)}, {count}x per step, materialising "
        f"{meta_text(first.scores)} scores: {fmt_bytes(written)} of score-sized tensors "
        f"written per step in the forward pass"
        + (", with an fp32 upcast of the scores" if upcast else "")
        + ". "
        + (
            f"Flash-eligible as written (no mask, head_dim {first.query.shape[-1]})."
            if eligible
            else "Not flash-eligible as written: " + "; ".join(blockers) + "."
        )
        + f" The fix frees {fmt_bytes(freed_bytes)} at the peak, {freed_text}."
    )
    fixed = tuple(fused_parts(shape, label="SDPA (fused)") for _ in range(count))
    return registered(CODE).finding(
        message=message,
        fix_title="Call F.scaled_dot_product_attention(q, k, v"
        + (", attn_mask=mask" if first.has_mask else "")
        + ") instead of the matmul-softmax-matmul chain",
        receipts=(
            receipt(
                m1.source,
                module=module_pattern(ops[c.first_matmul].module for c in group),
                op=f"{m1.name} -> {ops[first.softmax].name} -> {ops[first.second_matmul].name}",
                shapes=f"q {meta_text(first.query)}, scores {meta_text(first.scores)}, v {meta_text(first.value)}",
                count=count,
                end_line=max(last_lines)
                if last_lines
                and m1.source
                and ops[first.second_matmul].source.file == m1.source.file
                else None,
            ),
        ),
        effort="M",
        risk="medium",
        work=Work(
            fixed=tuple(p for parts in fixed for p in parts),
            now_ops=with_backward(chain_ops, backward),
            calls_per_step=count,
            bench={
                "kind": "eager_attention",
                "query": _meta(first.query, shape),
                "scores": {
                    "shape": list(first.scores.shape),
                    "dtype": first.scores.dtype,
                },
                "has_mask": first.has_mask,
                "requires_grad": True,
            },
            saved_bytes=freed_bytes,
        ),
        details={
            "flash_eligible": eligible,
            "blockers": blockers,
            "scores_written_bytes": written,
            "upcast": upcast,
            "freed_bytes_source": PREDICTED if freed_text.startswith("predicted") else ESTIMATED,
        },
    )


def _meta(query, shape: AttnShape) -> dict:
    # q as [B, H, Lq, D] for a benchmark of SDPA at the same shape and dtype
    return {
        "shape": [shape.batch, shape.heads_q, shape.len_q, shape.head_dim],
        "dtype": query.dtype,
        "len_k": shape.len_k,
    }
