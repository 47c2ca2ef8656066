"""``rms-norm-fused``: every hand-written RMSNorm computed by one ``F.rms_norm`` call.

Finds RMSNorm modules by what they compute (see :func:`levers.levers._find.probe_rms_norm`):
Hugging Face's ``LlamaRMSNorm``/``Qwen2RMSNorm``/``GemmaRMSNorm``, the ``demo``'s eager norm,
and a user's own. Each module keeps its weight and epsilon; only its forward changes, and it keeps
the module's dtype semantics:

- Llama's form (``weight * x_hat.to(input dtype)``, fp32 inside): the normalised value is
  rounded to the input's dtype before the weight multiplies it in the promoted dtype, as before.
  When input and weight share a dtype this is one fused call with the weight.
- Gemma's form (``(x_hat * (1 + weight)).type_as(x)``, fp32 inside): one fused call in fp32 with
  ``1 + weight``, cast back to the input's dtype.

A norm whose forward takes more than its input (a gated RMSNorm's gate) is fused on the calls
that pass only the input; a call that passes more runs the module's own forward.

Fix safety: changes numerics (the fused kernel reduces in another order); the parity test checks
losses and gradients within 1e-5 relative in fp32.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F

from levers.levers import register
from levers.levers._find import FUSED_MARK, RmsNormSite, rms_norm_sites
from levers.levers._patch import Undos
from levers.levers.lever import Lever, Target
from levers.vocab import CHANGES_NUMERICS

TOLERANCE = 1e-5


def fused_forward(site: RmsNormSite) -> Callable[..., torch.Tensor]:
    module, eps, offset = site.module, site.eps, site.weight_offset
    original = module.forward

    def forward(x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if any(a is not None for a in args) or any(v is not None for v in kwargs.values()):
            # the probe saw the module with its input alone; a call with more (a gated norm's
            # gate: Zamba2's and Mamba2's multiply the input by silu(gate) first) computes
            # something else, which the module's own forward does
            return original(x, *args, **kwargs)
        weight = module.weight
        shape = (weight.shape[0],)
        if x.shape[-1] != shape[0]:  # not the width the probe saw: the module's own forward
            return original(x, *args, **kwargs)
        if offset:
            scale = 1.0 + weight.float()
            return F.rms_norm(x.float(), shape, scale, eps).to(x.dtype)
        if site.output_rule == "promote":
            if x.dtype == weight.dtype:
                return F.rms_norm(x, shape, weight, eps)
            # x_hat rounded to the input's dtype first, then the weight: the module's own order
            normed = F.rms_norm(x.float(), shape, None, eps).to(x.dtype)
            return weight * normed
        return F.rms_norm(x.float(), shape, weight.float(), eps).to(x.dtype)

    return forward


def applies(target: Target) -> str | None:
    if not rms_norm_sites(target.model):
        return (
            "no unfused RMSNorm found: no leaf module with a 1-D weight and an eps whose forward "
            "computes x * rsqrt(mean(x^2) + eps) * weight (nn.RMSNorm and F.rms_norm are fused)"
        )
    return None


def patch(target: Target) -> Callable[[], None]:
    undos = Undos()
    for site in rms_norm_sites(target.model):
        undos.set_attr(site.module, "forward", fused_forward(site))
        undos.set_attr(site.module, FUSED_MARK, True)
    return undos


LEVER = register(
    Lever(
        id="rms-norm-fused",
        title="Compute each RMSNorm with one F.rms_norm call, same weight, eps and dtypes",
        safety=CHANGES_NUMERICS,
        tolerance=TOLERANCE,
        fixes=("NORM001",),
        applies=applies,
        patch=patch,
        needs_gpu=True,
    )
)
