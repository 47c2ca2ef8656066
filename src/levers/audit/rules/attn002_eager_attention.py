"""ATTN002 eager-attention: attention written as matmul, softmax, matmul, materialising scores.

## What it does
Finds attention computed by hand: a matmul (or einsum) that writes [.., Lq, Lk] scores, then a
softmax (often after scaling, a mask and an fp32 upcast), then a matmul with the values. It
reports the bytes of score-sized tensors written per step, whether the scores are upcast to fp32,
and whether the call is flash-eligible as written (no mask, equal head dims <= 256).

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
from levers.audit.config import RuleConfig
from levers.audit.finding import Finding, Work
from levers.audit.patterns import (
    backward_index,
    fmt_bytes,
    group_by_source,
    meta_text,
    module_pattern,
    receipt,
    with_backward,
)
from levers.audit.patterns_attention import AttentionChain, find_eager_attention
from levers.audit.rules.registry import registered, rule
from levers.vocab import CHANGES_NUMERICS

CODE, NAME = "ATTN002", "eager-attention"


@rule(CODE, NAME, severity="high", fix_safety=CHANGES_NUMERICS, levers=("sdpa-attention",))
def check(capture: Capture, config: RuleConfig) -> Iterator[Finding]:
    chains = find_eager_attention(capture)
    # no hand-written attention in the forward pass
    if not chains:
        return
    backward = backward_index(capture)
    ops = capture.ops
    groups = group_by_source(chains, lambda c: ops[c.first_matmul].source)
    for group in groups.values():
        yield _finding(group, capture, config, backward)


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
    group: list[AttentionChain], capture: Capture, config: RuleConfig, backward
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
            saved_bytes=count * scores_saved_bytes(shape),
        ),
        details={
            "flash_eligible": eligible,
            "blockers": blockers,
            "scores_written_bytes": written,
            "upcast": upcast,
        },
    )


def _meta(query, shape: AttnShape) -> dict:
    # q as [B, H, Lq, D] for a benchmark of SDPA at the same shape and dtype
    return {
        "shape": [shape.batch, shape.heads_q, shape.len_q, shape.head_dim],
        "dtype": query.dtype,
        "len_k": shape.len_k,
    }
