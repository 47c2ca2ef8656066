"""``grouped-mm-autocast``: a mixture of experts' grouped matmuls in autocast's dtype.

Autocast casts a linear's operands to bf16, but ``torch._grouped_mm`` (``F.grouped_mm``) is not
on its list. transformers 5 runs a mixture of experts' projections through it
(``transformers.integrations.moe._grouped_mm``) and, to avoid a dtype mismatch, casts the
activations to the weights' dtype: with fp32 master weights under bf16 autocast the expert
GEMMs, most of a MoE step's FLOPs, run in fp32. Measured on an H200 (the zoo's mixtral, ~0.8e9
parameters, batch 4 x 1024): the experts were 78% of a 148 ms step at 37.5 TFLOP/s, and
casting both operands to bf16 ran the step 2.22x faster (bench/results/moe_h200/).

The lever gives ``torch._grouped_mm`` the autocast rule it lacks: an autocast kernel for
``aten::_grouped_mm`` (CUDA and CPU; ``torch.library``) that casts its fp32 operands to
autocast's dtype, as autocast casts a linear's, so experts written in any code (torchtitan-style
``torch._grouped_mm`` calls included) run in bf16; the gradient flows back through the casts
to the fp32 weights. On a Hugging Face model it also wraps transformers' grouped-matmul
dispatcher to cast both operands before its own dtype check: under torch.compile transformers
routes fp32 weights to its per-expert fallback op, which the aten rule would not reach, and the
wrapper is the form measured on the H200. With autocast off nothing changes. The undo removes
the kernel and puts transformers' function back. Both are process-wide: they act on every such
model in the process while on. Where torch itself autocasts ``_grouped_mm`` (a later release),
a model outside transformers has nothing to gain and the lever says so.

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
AUTOCAST_KEYS = {"cuda": "AutocastCUDA", "cpu": "AutocastCPU"}  # device type -> dispatch key


def _moe_module() -> Any:
    try:
        from transformers.integrations import moe
    except ImportError:
        return None
    return moe if callable(getattr(moe, "_grouped_mm", None)) else None


def _experts(model: torch.nn.Module) -> list[torch.nn.Module]:
    """transformers' ``*Experts`` modules, or any module named ``experts`` (the bottleneck's
    notion of a mixture of experts' experts)."""
    return [
        module
        for name, module in model.named_modules()
        if type(module).__name__.endswith("Experts") or name.rpartition(".")[2] == "experts"
    ]


def torch_autocasts_grouped_mm() -> bool:
    """Whether this torch already has an autocast rule for ``aten::_grouped_mm``."""
    return any(
        torch._C._dispatch_has_kernel_for_dispatch_key("aten::_grouped_mm", key)
        for key in AUTOCAST_KEYS.values()
    )


def applies(target: Target) -> str | None:
    model = target.model
    experts = _experts(model)
    if not experts:
        return (
            "no experts module (a transformers *Experts module, or a module named experts) "
            "whose grouped matmuls to cast"
        )
    weights = [p for m in experts for p in m.parameters()]
    if weights and all(p.dtype != torch.float32 for p in weights):
        return f"the experts' weights are already {weights[0].dtype}: nothing to cast"
    if not is_hf_model(model):
        if torch_autocasts_grouped_mm():
            return "torch's autocast already casts torch._grouped_mm in this release"
        return None
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
    return None


def _autocast_kernel(device: str, key: str) -> Callable[..., torch.Tensor]:
    """``aten::_grouped_mm``'s autocast kernel for ``device``: fp32 operands (and bias) to
    autocast's dtype, then the op below autocast."""
    below = torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, key))

    def grouped_mm(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
        dtype = torch.get_autocast_dtype(device)
        cast = lambda t: t.to(dtype) if t is not None and t.dtype == torch.float32 else t  # noqa: E731
        with torch._C._ExcludeDispatchKeyGuard(below):
            return torch.ops.aten._grouped_mm(cast(mat_a), cast(mat_b), offs, cast(bias), out_dtype)

    return grouped_mm


def register_autocast_rule() -> Callable[[], None]:
    """Register the autocast kernels; returns their removal."""
    library = torch.library.Library("aten", "IMPL")
    for device, key in AUTOCAST_KEYS.items():
        library.impl("_grouped_mm", _autocast_kernel(device, key), key)
    # torch.library has no public removal: a Library's registrations go with its _destroy
    return library._destroy


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
    undos: list[Callable[[], None]] = []
    if not torch_autocasts_grouped_mm():
        undos.append(register_autocast_rule())
    moe = _moe_module() if is_hf_model(target.model) else None
    if moe is not None:
        original = moe._grouped_mm
        moe._grouped_mm = autocast_grouped_mm(original)
        undos.append(lambda: setattr(moe, "_grouped_mm", original))

    def undo() -> None:
        for step in reversed(undos):
            step()

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
            "process-wide while on (an autocast rule for aten::_grouped_mm, and transformers' "
            "dispatcher, serve every model); outside transformers, experts are found by name "
            "(*Experts, or a module named experts); measured on the H200 in its transformers form"
        ),
    )
)
