"""FUSE001 unfused-swiglu: a gated MLP activation (SwiGLU, GeGLU) run as separate kernels.

## What it does
Finds `silu(gate) * up` (or `gelu(gate) * up`) in the forward pass: the activation and the
product as two kernels of one MLP, with their backward kernels, and prices one fused kernel
forward and one backward at the same shapes.

## Why is this bad?
The activation writes a [tokens, ffn] tensor that the product reads straight back, and backward
does the same again: the widest activation of the block makes extra round trips through HBM and
extra launches in every layer, and the intermediate is kept for backward.

## Example
```python
def forward(self, x):
    return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
```

Use instead:
```python
from liger_kernel.ops.swiglu import LigerSiLUMulFunction

def forward(self, x):
    return self.down_proj(LigerSiLUMulFunction.apply(self.gate_proj(x), self.up_proj(x)))
```

## Fix
Liger Kernel's fused SwiGLU (lever `liger-kernels`, where Liger supports the model), or a
regional compile of each block, which fuses the chain (lever `compile-blocks`).

## Fix safety
Changes numerics: the fused kernel computes the activation in fp32 registers; results agree to
rounding.

## Known problems
Matched by adjacency: the product must come within six kernels of the activation, in the same
MLP, and read a tensor of the activation's shape. A GeGLU with the tanh approximation is matched
as GeGLU; Liger fuses only some variants.

## References
- Shazeer, GLU Variants Improve Transformer (2020), https://arxiv.org/abs/2002.05202
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

CODE, NAME = "FUSE001", "unfused-swiglu"
LEVERS = ("liger-kernels", "compile-blocks")


@rule(CODE, NAME, severity="medium", fix_safety=CHANGES_NUMERICS, levers=LEVERS)
def check(capture: Capture, config: RuleConfig) -> Iterator[Finding]:
    chains = pattern_view(capture).gated_activations
    # no gated activation, or every one is already fused
    if not chains:
        return
    for group in group_chains(chains, capture):
        yield fusion_finding(
            CODE, group, capture, config,
            fix_title="Use a fused SwiGLU kernel (one kernel forward, one backward)",
        )
