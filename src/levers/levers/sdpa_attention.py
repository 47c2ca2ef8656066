"""``sdpa-attention``: eager attention (matmul, softmax, matmul) replaced by fused SDPA.

Found by the switch each kind of model already has for it, flipped on the live model:

- Hugging Face: every config the model's modules read with ``_attn_implementation == "eager"``
  is set to ``"sdpa"`` (the attention modules and the mask builder read it at each forward), when
  the model class declares ``_supports_sdpa``;
- timm: attention modules with ``fused_attn = False`` get ``True``;
- modules with a ``use_sdpa = False`` switch (the ``demo``'s vision attention) get ``True``.

Fix safety: changes numerics (the fused kernel's softmax accumulates on chip in another order).
Tolerance checked: 1e-5 relative in fp32.
"""

from __future__ import annotations

from typing import Callable

import torch

from levers.levers import register
from levers.levers._find import hf_configs, is_hf_model
from levers.levers._patch import Undos
from levers.levers.lever import Lever, Target
from levers.vocab import CHANGES_NUMERICS

SWITCHES = ("fused_attn", "use_sdpa")  # timm's, and the plain spelling


def _eager_configs(model: torch.nn.Module) -> list:
    return [c for c in hf_configs(model) if c._attn_implementation == "eager"]


def _switch_modules(model: torch.nn.Module) -> list[tuple[torch.nn.Module, str]]:
    found = []
    for module in model.modules():
        for name in SWITCHES:
            if getattr(module, name, None) is False:
                found.append((module, name))
    return found


def applies(target: Target) -> str | None:
    model = target.model
    if is_hf_model(model) and _eager_configs(model):
        if not getattr(model, "_supports_sdpa", False):
            return f"{type(model).__name__} does not support SDPA attention in transformers"
        return None
    if _switch_modules(model):
        return None
    return (
        "no eager attention switch found: no Hugging Face config with "
        "_attn_implementation='eager', and no module with fused_attn=False or use_sdpa=False "
        "(attention written out by hand in user code: call F.scaled_dot_product_attention there)"
    )


def patch(target: Target) -> Callable[[], None]:
    undos = Undos()
    for config in _eager_configs(target.model):
        undos.set_attr(config, "_attn_implementation", "sdpa")
    for module, name in _switch_modules(target.model):
        undos.set_attr(module, name, True)
    return undos


LEVER = register(
    Lever(
        id="sdpa-attention",
        title="Run attention through F.scaled_dot_product_attention instead of eager matmuls",
        safety=CHANGES_NUMERICS,
        tolerance=1e-5,
        fixes=("ATTN002",),
        applies=applies,
        patch=patch,
        needs_gpu=True,
        known_problems=(
            "the demo's vision attention drops its padding mask on the SDPA path, as its own "
            "fix does (every patch is valid there); output_attentions=True needs eager in HF"
        ),
    )
)
