"""``grouped-mm-autocast``: a mixture of experts' grouped matmuls in autocast's dtype.

Autocast casts a linear's operands to bf16, but ``torch._grouped_mm`` (``F.grouped_mm``) is not
on its list. transformers 5 runs a mixture of experts' projections through it
(``transformers.integrations.moe._grouped_mm``) and, to avoid a dtype mismatch, casts the
activations to the weights' dtype: with fp32 master weights under bf16 autocast the expert
GEMMs, most of a MoE step's FLOPs, run in fp32. Measured on an H200 (the zoo's mixtral, ~0.8e9
parameters, batch 4 x 1024): the experts were 78% of a 148 ms step at 37.5 TFLOP/s, and
casting both operands to bf16 ran the step 2.22x faster (bench/results/moe_h200/).

The lever wraps transformers' grouped-matmul dispatcher so that, while autocast is on for the
operands' device and the weights are fp32, both operands are cast to autocast's dtype first, as
autocast casts a linear's; the gradient flows back through the casts to the fp32 weights. With
autocast off nothing changes. The undo puts transformers' function back. The wrapper is
process-wide (it is transformers' module function), so it acts on every such model in the
process while on. Under torch.compile it also lets transformers take the grouped kernel, which
it refuses for fp32 weights (its per-expert fallback instead).

Fix safety: changes numerics (the expert GEMMs in bf16 instead of fp32, as autocast runs every
linear). Tolerance checked: 2e-2 relative on the loss of a bf16-autocast step on a CPU
(tests/levers/test_grouped_mm_autocast.py).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from levers.levers import register
from levers.levers._find import is_hf_model
from levers.levers.lever import Lever, Target
from levers.vocab import CHANGES_NUMERICS

GROUPED = "grouped_mm"


def _moe_module() -> Any:
    try:
        from transformers.integrations import moe
    except ImportError:
        return None
    return moe if callable(getattr(moe, "_grouped_mm", None)) else None


def _experts(model: torch.nn.Module) -> list[torch.nn.Module]:
    return [m for m in model.modules() if type(m).__name__.endswith("Experts")]


def applies(target: Target) -> str | None:
    model = target.model
    if not is_hf_model(model):
        return (
            "not a Hugging Face model: in your own experts, cast both operands of "
            "torch._grouped_mm to torch.get_autocast_dtype(device) while autocast is on"
        )
    experts = _experts(model)
    if not experts:
        return "no experts module (transformers' *Experts) whose matmuls to cast"
    if _moe_module() is None:
        return "this transformers has no grouped-matmul dispatcher (integrations.moe._grouped_mm)"
    getter = getattr(model, "get_experts_implementation", None)
    implementations = getter() if callable(getter) else {}
    if GROUPED not in implementations.values():
        return (
            f"its experts run {sorted(set(map(str, implementations.values())))}, not grouped "
            "matmuls: per-expert linears and batched matmuls are cast by autocast already "
            "(lever experts-grouped-mm switches them to grouped matmuls first)"
        )
    weights = [p for m in experts for p in m.parameters(recurse=False)]
    if weights and all(p.dtype != torch.float32 for p in weights):
        return f"the experts' weights are already {weights[0].dtype}: nothing to cast"
    return None


def autocast_grouped_mm(original: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """transformers' ``_grouped_mm(input, weight, offs)`` with fp32 operands cast to autocast's
    dtype while autocast is on for their device."""

    def grouped_mm(input: torch.Tensor, weight: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:  # noqa: A002
        device = input.device.type
        if weight.dtype == torch.float32 and torch.is_autocast_enabled(device):
            dtype = torch.get_autocast_dtype(device)
            input, weight = input.to(dtype), weight.to(dtype)  # noqa: A001
        return original(input, weight, offs)

    grouped_mm.__wrapped__ = original  # type: ignore[attr-defined]
    return grouped_mm


def patch(target: Target) -> Callable[[], None]:
    moe = _moe_module()
    original = moe._grouped_mm
    moe._grouped_mm = autocast_grouped_mm(original)

    def undo() -> None:
        moe._grouped_mm = original

    return undo


LEVER = register(
    Lever(
        id="grouped-mm-autocast",
        title="Run a mixture of experts' grouped matmuls in autocast's dtype, not fp32",
        safety=CHANGES_NUMERICS,
        tolerance=2e-2,
        fixes=("DTYPE002",),
        applies=applies,
        patch=patch,
        known_problems=(
            "acts only while autocast is on (a step without autocast is unchanged); "
            "process-wide while on: transformers' dispatcher is one function for every model; "
            "experts written outside transformers are not reached"
        ),
    )
)
