"""``float8``: torchao's float8 training on the linears large enough to pay.

Each ``nn.Linear`` that the filter below takes is swapped for torchao's ``Float8Linear``
(``torchao.float8.convert_to_float8_training`` with a ``module_filter_fn``): its three matmuls
(the forward, and the backward's two) run on float8 tensor cores with dynamic scales, at twice
the bf16 peak on Hopper. ``Float8Linear.from_float`` gives the new module the very ``weight``
and ``bias`` Parameters of the old one, so the optimizer, the state_dict and a training run's
parameters are untouched; the undo puts the original ``nn.Linear`` objects back in their parents.

Which linears (:func:`plan`; K is ``in_features``, N ``out_features``):

- not the output head: the Linear onto the vocabulary (a Hugging Face model's
  ``get_output_embeddings()``, a weight tied to an ``nn.Embedding``, or N equal to the largest
  embedding's ``num_embeddings``). Its rounding lands on the logits directly; torchtitan leaves
  its head out by default as well (``filter_fqns=["output"]``);
- exactly ``nn.Linear`` (a subclass, a LoRA layer say, has a forward of its own);
- K and N divisible by 16 (a requirement of the float8 matmul);
- not small: torchao's own ``torchao.float8._auto_filter_for_recipe``, the filter torchtitan's
  ``auto_filter_small_kn`` calls. Its thresholds come from torchao's microbenchmarks on an H100
  (below them the casts cost more than the faster matmul saves): tensorwise leaves a linear
  with K <= 4096 and N <= 1024; rowwise one with N <= 2048, K <= 1024, or N <= 4096 and
  K <= 2048.

The audit's DTYPE003 recommends it where these linears' bf16 matmuls are a large share of a step
on a GPU of compute capability 8.9 or later (its filter mirrors :func:`plan` on the capture).

Recipe (option ``recipe``): ``tensorwise`` (default; one scale per tensor, cuBLAS's float8 GEMM)
or ``rowwise`` (one power-of-two scale per row, more accurate, CUTLASS's kernel). The lever
``float8-rowwise`` is the rowwise recipe under an id of its own, so that ``levers tune`` tries
the two as alternatives.

With compile: torchao's casts (amax, scale, cast to float8) are separate kernels in eager mode,
which inductor fuses into their neighbours; float8 pays under compile-blocks or compile-model.
Both trace on the first call, after every lever of a stack is applied, so
``float8,compile-blocks`` and ``compile-blocks,float8`` trace the converted blocks alike. A
model that already ran compiled before the conversion is traced once more (a recompile).

Process-wide state: the first ``convert_to_float8_training`` of a process patches inductor's
Triton codegen of min/max (a workaround for https://github.com/triton-lang/triton/issues/11111,
numerically the same); the undo puts the codegen back as it was.

Needs torchao (``pip install 'levers[float8]'``) and a CUDA GPU of compute capability 8.9 or
later (Ada, Hopper, Blackwell). Torch also runs float8 matmuls on a CPU, slowly: the CPU tests
convert and train there.

Fix safety: changes numerics (e4m3 keeps 3 mantissa bits; the dynamic scales keep the range).
Tolerance checked: 1e-3 relative on the losses and 0.15 on each gradient (tensorwise casts the
backward's gradients to e5m2, 2 mantissa bits), in fp32 on a CPU over two steps of a small llama
(tests/levers/test_float8.py). Its proof is the quality read of ``levers ab`` (the held-out loss
of the built-in workloads, paired over the run's steps), not a one-step parity.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from levers.optional import import_quietly
from levers.hardware import FLOAT8_MIN_CAPABILITY, FLOAT8_NARROW, FLOAT8_NARROW_MEASURED
from levers.levers import register
from levers.levers._patch import Undos
from levers.levers.lever import Lever, Target
from levers.memory.standin import predicted_capability
from levers.vocab import CHANGES_NUMERICS

RECIPES = ("tensorwise", "rowwise")
MIN_CAPABILITY = FLOAT8_MIN_CAPABILITY
# torchao's thresholds (torchao.float8.float8_linear_utils), in words for the reasons
SMALL = {
    "tensorwise": "K <= 4096 and N <= 1024",
    "rowwise": "N <= 2048, K <= 1024, or N <= 4096 and K <= 2048",
}
INSTALL = "torchao is not installed (pip install torchao, or pip install 'levers[float8]')"
TOLERANCE = 1e-3  # on the losses; the test holds each gradient to 0.15
# the least tolerance of an A/B's one-step parity checks on float8 (bf16's table allows 1e-2 after
# step 1): its forward rounds to 3 mantissa bits (e4m3) and its gradients to 2 (e5m2). After one
# step on the H200 the total gradient norm moved 1.9e-3 on the built-in llama 1b and 1.4e-2 on
# the hf llama 1b (bench/results/float8_quality_h200, audit_llama_1b_h200); the held-out loss of
# the quality read is its proof
PARITY_FLOOR = 5e-2
KNOWN_PROBLEMS = (
    "pays only where the linears are large and compiled (eager float8 adds cast kernels); "
    "needs compute capability 8.9+ and torchao; the held-out loss is its proof (levers ab's "
    "quality read), not the parity gate alone"
)


@dataclass(frozen=True)
class LinearChoice:
    """One ``nn.Linear`` of the model and whether float8 converts it."""

    path: str
    in_features: int  # K
    out_features: int  # N
    converts: bool
    why: str  # why it is left as it is; "" when it converts


def torchao_float8() -> Any | None:
    """``torchao.float8``, or None when torchao is not installed."""
    try:
        return import_quietly("torchao.float8")
    except ImportError:
        return None


def check(options: dict[str, Any]) -> None:
    recipe = options.get("recipe", "tensorwise")
    if recipe not in RECIPES:
        raise ValueError(f"float8: recipe={recipe!r} is not one of {', '.join(RECIPES)}")


def gpu_reason(model: nn.Module) -> str | None:
    """Why the model's GPU cannot run float8 matmuls, or None."""
    need = (
        "float8 matmuls need a CUDA GPU of compute capability 8.9 or later (Ada, Hopper, "
        "Blackwell)"
    )
    devices = {p.device for p in model.parameters()}
    if not devices:
        return "the model has no parameters"

    # in a memory prediction for a GPU, that GPU's capability decides, not this machine's
    predicted = predicted_capability()
    on_cuda = predicted is not None or torch.cuda.is_available()
    if any(d.type != "cuda" for d in devices) or not on_cuda:
        where = ", ".join(sorted({d.type for d in devices}))
        return f"{need}; the model's parameters are on {where}"
    if predicted is not None:
        if predicted < MIN_CAPABILITY:
            return f"{need}; the predicted GPU has {predicted[0]}.{predicted[1]}"
        return None
    for device in devices:
        capability = torch.cuda.get_device_capability(device)
        if capability < MIN_CAPABILITY:
            name = torch.cuda.get_device_name(device)
            return f"{need}; {name} has {capability[0]}.{capability[1]}"
    return None


def output_heads(model: nn.Module) -> set[int]:
    """The ids of the Linear modules that project onto the vocabulary."""
    embeddings = [m for m in model.modules() if isinstance(m, nn.Embedding)]
    tied = {id(e.weight) for e in embeddings}
    vocab = max((e.num_embeddings for e in embeddings), default=None)
    heads = set()
    get_output = getattr(model, "get_output_embeddings", None)
    hf_head = get_output() if callable(get_output) else None
    for module in model.modules():
        if not isinstance(module, nn.Linear):
            continue
        if module is hf_head or id(module.weight) in tied or module.out_features == vocab:
            heads.add(id(module))
    return heads


def plan(
    model: nn.Module, recipe: str, small_filter: Callable[[nn.Module, str], bool]
) -> list[LinearChoice]:
    """Every ``nn.Linear`` below the root, and whether it converts (``small_filter`` is torchao's
    ``_auto_filter_for_recipe(recipe, filter_fqns=[])``)."""
    heads = output_heads(model)
    choices = []
    for path, module in model.named_modules():
        if not path or not isinstance(module, nn.Linear):
            continue  # a root Linear has no parent to be swapped in
        k, n = module.in_features, module.out_features
        if id(module) in heads:
            why = f"the output head (N={n}, the vocabulary): its rounding lands on the logits"
        elif type(module) is not nn.Linear:
            why = f"a subclass of nn.Linear ({type(module).__name__}) with a forward of its own"
        elif k % 16 or n % 16:
            why = f"K={k} or N={n} is not a multiple of 16 (float8 matmuls need one)"
        elif not small_filter(module, path):
            why = f"too small to pay under {recipe} (K={k}, N={n}; left when {SMALL[recipe]})"
        else:
            why = ""
        choices.append(LinearChoice(path, k, n, not why, why))
    return choices


def float8_linears(model: nn.Module, ao: Any) -> list[str]:
    """The paths of the model's Float8Linear modules (``ao`` is ``torchao.float8``)."""
    float8_linear = ao.float8_linear.Float8Linear
    return [path for path, m in model.named_modules() if isinstance(m, float8_linear)]


def reason(model: nn.Module, recipe: str) -> str | None:
    """Why float8 with ``recipe`` does not apply to ``model``, or None."""
    not_here = gpu_reason(model)
    if not_here is not None:
        return not_here
    ao = torchao_float8()
    if ao is None:
        return INSTALL
    done = float8_linears(model, ao)
    if done:
        return f"the model already has float8 linears ({done[0]}, ...): float8 is applied"
    choices = plan(model, recipe, ao._auto_filter_for_recipe(recipe, filter_fqns=[]))
    if not any(c.converts for c in choices):
        if not choices:
            return "the model has no nn.Linear (torchao converts nn.Linear modules only)"
        shown = "; ".join(f"{c.path}: {c.why}" for c in choices[:3])
        more = f"; and {len(choices) - 3} more" if len(choices) > 3 else ""
        return f"no nn.Linear passes the float8 filter ({shown}{more})"
    return None


def convert(model: nn.Module, recipe: str) -> Callable[[], None]:
    """Swap the linears :func:`plan` takes for Float8Linear; returns the undo."""
    ao = torchao_float8()
    choices = plan(model, recipe, ao._auto_filter_for_recipe(recipe, filter_fqns=[]))
    chosen = {c.path for c in choices if c.converts}
    places = []  # (parent, attribute, the original Linear)
    for path in chosen:
        parent_path, _, name = path.rpartition(".")
        places.append((model.get_submodule(parent_path), name, model.get_submodule(path)))

    def put_back() -> None:
        for parent, name, original in places:
            setattr(parent, name, original)

    undos = Undos()
    undos.add(_codegen_restorer())
    undos.add(put_back)
    try:
        ao.convert_to_float8_training(
            model,
            config=ao.Float8LinearConfig.from_recipe_name(recipe),
            module_filter_fn=lambda _, path: path in chosen,
        )
    except BaseException:
        undos()  # a partial conversion goes back too
        raise
    undos.choices = choices  # type: ignore[attr-defined]
    undos.recipe = recipe  # type: ignore[attr-defined]
    return undos


def _codegen_restorer() -> Callable[[], None]:
    """The undo of torchao's process-wide patch of inductor's Triton min/max codegen."""
    patch_module = import_quietly("torchao.float8._inductor_patch")
    try:
        from torch._inductor.codegen.triton import TritonOverrides
    except Exception:  # noqa: BLE001 - no inductor Triton codegen here: torchao patches nothing
        return lambda: None
    before = {name: vars(TritonOverrides).get(name) for name in ("minimum", "maximum")}
    was_patched = getattr(patch_module, "_PATCHED", None)

    def restore() -> None:
        for name, value in before.items():
            if value is None:
                if name in vars(TritonOverrides):
                    delattr(TritonOverrides, name)
            else:
                setattr(TritonOverrides, name, value)
        if was_patched is not None:
            patch_module._PATCHED = was_patched

    return restore


def slower_here(target: Target) -> str | None:
    """Why tensorwise float8 loses for speed on this model: every matmul it would convert is
    narrow (its smaller side at most ``levers.hardware.FLOAT8_NARROW``), the regime it was
    measured slower in.
    None where it does not apply (``applies`` says why) and for the rowwise recipe, whose filter
    leaves such matmuls already."""
    model = target.model
    if _recipe(target) != "tensorwise" or gpu_reason(model) is not None:
        return None
    ao = torchao_float8()
    if ao is None:
        return None
    choices = plan(model, "tensorwise", ao._auto_filter_for_recipe("tensorwise", filter_fqns=[]))
    kept = [c for c in choices if c.converts]
    if not kept:
        return None
    widest = max(kept, key=lambda c: min(c.in_features, c.out_features))
    k, n = widest.in_features, widest.out_features
    if min(k, n) > FLOAT8_NARROW:
        return None
    return (
        f"the widest matmul it would convert ({widest.path}: K={k}, N={n}) has a "
        f"smaller side of at most {FLOAT8_NARROW}, where its scales cost what the matmul saves: "
        f"on top of compile on an H200 it ran {FLOAT8_NARROW_MEASURED}"
    )


def _recipe(target: Target) -> str:
    return str(target.options.get("recipe", "tensorwise"))


def applies(target: Target) -> str | None:
    return reason(target.model, _recipe(target))


def patch(target: Target) -> Callable[[], None]:
    return convert(target.model, _recipe(target))


LEVER = register(
    Lever(
        options=("recipe",),
        check=check,
        id="float8",
        device_bound=True,
        title="Train the large linears in float8 (torchao; tensorwise or rowwise scales)",
        safety=CHANGES_NUMERICS,
        tolerance=TOLERANCE,
        parity_floor=PARITY_FLOOR,
        measured_on=("compile-blocks",),  # eager, its casts are kernels of their own
        fixes=("DTYPE003",),
        applies=applies,
        patch=patch,
        slower_here=slower_here,
        needs_gpu=True,
        runs_on_cpu=False,
        known_problems=KNOWN_PROBLEMS,
    )
)
