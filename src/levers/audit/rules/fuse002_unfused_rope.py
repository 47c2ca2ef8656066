"""FUSE002 unfused-rope: rotary position embeddings run as a chain of elementwise kernels.

## What it does
Finds rotate-half RoPE in the forward pass: `x * cos + cat(-x2, x1) * sin`, as separate mul,
neg, cat, mul and add kernels (the slices are views), once for the queries and once for the
keys of every layer, with their backward kernels, and prices one fused kernel forward and one
backward per tensor at the same shapes.

## Why is this bad?
Five kernels each read and write a full [batch, heads, tokens, head_dim] tensor where one
kernel reading q (or k) and writing the rotated result would do; backward repeats it. Every
layer pays it twice, on the attention's critical path.

## Example
```python
def apply_rotary_pos_emb(q, k, cos, sin):
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
```

Use instead:
```python
from liger_kernel.transformers.rope import liger_rotary_pos_emb

q, k = liger_rotary_pos_emb(q, k, cos, sin)
```

## Fix
Liger Kernel's fused RoPE (lever `liger-kernels`, where Liger supports the model), or a regional
compile of each block, which fuses the chain (lever `compile-blocks`).

## Fix safety
Changes numerics: the fused kernel rounds once instead of after every op; results agree to
rounding.

## Known problems
Matched by shapes: a neg of half the head dimension followed by a cat that doubles it, then a
mul and an add of the full shape within six kernels, in one module. Interleaved (complex-number)
RoPE, as in the original Llama code, is not matched.

## References
- Su et al., RoFormer: Enhanced Transformer with Rotary Position Embedding (2021), https://arxiv.org/abs/2104.09864
- https://github.com/linkedin/Liger-Kernel
"""

from __future__ import annotations

from collections.abc import Iterator

from levers.capture.records import Capture
from levers.audit.config import RuleConfig
from levers.audit.finding import Finding
from levers.audit.fusion_finding import fusion_finding, group_chains
from levers.audit.pattern_view import pattern_view
from levers.audit.rules.registry import rule
from levers.vocab import CHANGES_NUMERICS

CODE, NAME = "FUSE002", "unfused-rope"
LEVERS = ("liger-kernels", "compile-blocks")


@rule(CODE, NAME, severity="medium", fix_safety=CHANGES_NUMERICS, levers=LEVERS)
def check(capture: Capture, config: RuleConfig) -> Iterator[Finding]:
    chains = pattern_view(capture).unfused_rope
    # no rotate-half RoPE, or it is already fused
    if not chains:
        return
    for group in group_chains(chains, capture):
        yield fusion_finding(
            CODE, group, capture, config,
            fix_title="Use a fused RoPE kernel for q and k (one kernel forward, one backward each)",
        )
