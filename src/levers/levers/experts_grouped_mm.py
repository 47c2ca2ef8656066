"""``experts-grouped-mm``: a Hugging Face mixture of experts' experts as grouped matmuls.

transformers 5 runs the experts of its mixture-of-experts models (Mixtral, Qwen-MoE, ...)
through an experts interface that each forward reads from the config
(``config._experts_implementation``): ``"eager"`` loops over the experts, one small matmul per
expert and projection, with a host read of which experts got tokens; ``"grouped_mm"`` sorts the
tokens by expert and runs each projection as one ``torch._grouped_mm`` (``F.grouped_mm``), the
grouped GEMM kernel of sm80 and later; ``"batched_mm"`` pads every expert to the same rows.
transformers picks ``grouped_mm`` by default where it can dispatch, and ``eager`` is what a model
keeps when it was asked for it (``experts_implementation="eager"``) or saved with it.

The lever sets ``grouped_mm`` on the model (``PreTrainedModel.set_experts_implementation``,
which checks that the model and torch can dispatch it) and the undo sets back what
``get_experts_implementation`` read before. Parameters, state dict and routing are unchanged.

Fix safety: changes numerics (the grouped kernel sums in another order; tokens are reordered).
Tolerance checked: 1e-5 relative in fp32 on a CPU (tests/levers/test_experts_grouped_mm.py).
"""

from __future__ import annotations

from typing import Any, Callable

from levers.levers import register
from levers.levers._find import is_hf_model
from levers.levers.lever import Lever, Target
from levers.vocab import CHANGES_NUMERICS

GROUPED = "grouped_mm"


def _implementations(model: Any) -> dict[str, Any] | None:
    getter = getattr(model, "get_experts_implementation", None)
    if not callable(getter) or not any(_is_experts(m) for m in model.modules()):
        return None
    return getter()


def _is_experts(module: Any) -> bool:
    return type(module).__name__.endswith("Experts")


def applies(target: Target) -> str | None:
    model = target.model
    if not is_hf_model(model):
        return (
            "not a Hugging Face model: experts written in your own code run as grouped matmuls "
            "through torch._grouped_mm (F.grouped_mm on torch 2.10+)"
        )
    current = _implementations(model)
    if current is None:
        return "no experts module (transformers' *Experts) with an experts implementation to set"
    if all(value == GROUPED for value in current.values() if value is not None):
        return "its experts already run as grouped matmuls (experts_implementation='grouped_mm')"
    try:
        model._grouped_mm_can_dispatch()
    except (ValueError, ImportError, AttributeError) as exc:
        return f"transformers cannot dispatch grouped_mm here: {exc}"
    return None


def patch(target: Target) -> Callable[[], None]:
    model = target.model
    before = model.get_experts_implementation()
    model.set_experts_implementation(GROUPED)

    def undo() -> None:
        model.set_experts_implementation(before)

    return undo


LEVER = register(
    Lever(
        id="experts-grouped-mm",
        title="Run the experts of a mixture of experts as grouped matmuls, not one per expert",
        safety=CHANGES_NUMERICS,
        tolerance=1e-5,
        fixes=("MOE001",),
        applies=applies,
        patch=patch,
        known_problems=(
            "transformers' own default since 5.0, so it applies only to models set to eager or "
            "batched_mm; under torch.compile with fp32 weights transformers routes grouped_mm to "
            "its per-expert fallback"
        ),
    )
)
