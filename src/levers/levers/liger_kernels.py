"""``liger-kernels``: Liger Kernel's RoPE, SwiGLU and RMSNorm on a Hugging Face model it supports.

Calls Liger's ``apply_liger_kernel_to_<model type>(rope=True, swiglu=True, rms_norm=True,
cross_entropy=False, fused_linear_cross_entropy=False, model=model)`` (the loss is the lever
``fused-linear-cross-entropy``'s), each patch given the keywords it takes (Gemma's MLP kernel is
``geglu``, turned on where the others' ``swiglu`` is). Liger patches the instance's modules, and also globals of the
transformers modeling module (``apply_rotary_pos_emb``, the norm and MLP classes), which would
change every other model of that type in the process. This lever keeps the instance patches,
puts the module globals back at once, and swaps in only the function globals Liger replaced
(RoPE) while this model's forward runs. The undo restores every module's instance attributes and
the forward.

Fix safety: changes numerics (Triton kernels in bf16/fp32 with other reduction orders). Declared
tolerance 1e-2 relative; checked on a GPU only (Liger needs CUDA and Triton).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import sys
import types
from typing import Any, Callable

import torch

from levers.levers import register
from levers.levers._find import is_hf_model
from levers.levers._option_values import flag
from levers.levers._patch import Undos
from levers.levers.lever import Lever, Target
from levers.vocab import CHANGES_NUMERICS

ID = "liger-kernels"
MARK = "_levers_liger_kernels"
PATCHES = {"rope": True, "swiglu": True, "rms_norm": True, "cross_entropy": False,
           "fused_linear_cross_entropy": False}
_MISSING = object()
# what other patches call their MLP's kernel, which the swiglu option turns on or off
MLP_KERNELS = ("geglu", "relu_squared")


def check(options: dict[str, Any]) -> None:
    for key in PATCHES:
        if key in options:
            flag(ID, key, options[key])


def options_for(apply_fn: Callable[..., Any], options: dict[str, bool]) -> dict[str, bool]:
    """``options`` as ``apply_fn`` names them: a patch without a SwiGLU MLP takes its MLP's
    kernel by another name (Gemma's ``geglu``, Nemotron's ``relu_squared``), given the ``swiglu`` option's value; keywords
    the patch does not take are left out."""
    parameters = inspect.signature(apply_fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return dict(options)
    out = {k: v for k, v in options.items() if k in parameters}
    if "swiglu" not in parameters and "swiglu" in options:
        for name in MLP_KERNELS:
            if name in parameters:
                out[name] = options["swiglu"]
    return out


def _apply_function(model_type: str) -> Callable[..., Any] | None:
    transformers_api = importlib.import_module("liger_kernel.transformers")
    mapping = getattr(
        importlib.import_module("liger_kernel.transformers.monkey_patch"),
        "MODEL_TYPE_TO_APPLY_LIGER_FN",
        {},
    )
    return mapping.get(model_type) or getattr(
        transformers_api, f"apply_liger_kernel_to_{model_type}", None
    )


def is_compiled(model: torch.nn.Module) -> bool:
    return any(getattr(m, "_compiled_call_impl", None) is not None for m in model.modules())


def applies(target: Target) -> str | None:
    model = target.model
    if getattr(model, MARK, False):
        return "already applied to this model"
    if importlib.util.find_spec("liger_kernel") is None:
        return "liger-kernel not installed (pip install 'levers[kernels]' or liger-kernel)"
    if not is_hf_model(model):
        return "Liger Kernel patches Hugging Face transformers models only"
    if next(model.parameters()).device.type != "cuda":
        return "needs CUDA (Liger's kernels are Triton kernels)"
    if is_compiled(model):
        return (
            "parts of the model are torch.compile'd: torch.compile over Liger's kernels fails in "
            "dynamo (torch 2.11); use compile-blocks or liger-kernels, not both"
        )
    model_type = getattr(model.config, "model_type", None)
    if _apply_function(model_type) is None:
        return f"Liger Kernel has no patch for model type {model_type!r}"
    return None


def snapshot_classes(module: types.ModuleType) -> dict[type, dict[str, Any]]:
    """The attributes of every class defined in ``module`` (Liger may patch a class's forward)."""
    return {
        value: dict(vars(value))
        for value in vars(module).values()
        if isinstance(value, type) and value.__module__ == module.__name__
    }


def restore_classes(snapshot: dict[type, dict[str, Any]]) -> list[str]:
    """Put the class attributes back as they were; returns the ones that had changed."""
    changed = []
    for cls, before in snapshot.items():
        for name in [n for n in vars(cls) if n not in before]:
            changed.append(f"{cls.__name__}.{name}")
            delattr(cls, name)
        for name, value in before.items():
            if vars(cls).get(name, _MISSING) is not value and name not in ("__dict__", "__weakref__"):
                changed.append(f"{cls.__name__}.{name}")
                setattr(cls, name, value)
    return changed


def restore_globals(module: types.ModuleType, before: dict[str, Any]) -> dict[str, Any]:
    """Put the module's globals back; returns the values that had been replaced or added."""
    replaced = {n: v for n, v in vars(module).items() if before.get(n, _MISSING) is not v}
    for name in replaced:
        if name in before:
            setattr(module, name, before[name])
        else:
            delattr(module, name)
    return replaced


def patch(target: Target) -> Callable[[], None]:
    model = target.model
    apply_fn = _apply_function(model.config.model_type)
    modeling = sys.modules[type(model).__module__]
    globals_before = dict(vars(modeling))
    classes_before = snapshot_classes(modeling)
    instance_before = {m: dict(vars(m)) for m in model.modules()}
    # some Liger versions rename the patched module's class (a process-wide change)
    class_names = {type(m): type(m).__name__ for m in model.modules()}

    options = {**PATCHES, **{k: flag(ID, k, v) for k, v in target.options.items() if k in PATCHES}}
    apply_fn(model=model, **options_for(apply_fn, options))

    # what Liger replaced in the modeling module (and its classes); put it back at once
    replaced = restore_globals(modeling, globals_before)
    restore_classes(classes_before)
    # functions are looked up at call time: swap them in for this model's forward only
    scoped = {n: v for n, v in replaced.items() if callable(v) and not isinstance(v, type)}

    for cls, name in class_names.items():
        cls.__name__ = name
    undos = Undos()

    def restore_instances() -> None:
        for module, before in instance_before.items():
            own = vars(module)
            for name in list(own):
                if name not in before:
                    del own[name]
            own.update(before)

    undos.add(restore_instances)
    if scoped:
        original = model.forward

        @functools.wraps(original)
        def forward(*args: Any, **kwargs: Any) -> Any:
            saved = {name: getattr(modeling, name, _MISSING) for name in scoped}
            for name, value in scoped.items():
                setattr(modeling, name, value)
            try:
                return original(*args, **kwargs)
            finally:
                for name, value in saved.items():
                    if value is _MISSING:
                        delattr(modeling, name)
                    else:
                        setattr(modeling, name, value)

        undos.set_attr(model, "forward", forward)
    undos.set_attr(model, MARK, True)
    return undos


LEVER = register(
    Lever(
        options=tuple(PATCHES),
        check=check,
        id=ID,
        title="Use Liger Kernel's RoPE, SwiGLU and RMSNorm kernels",
        safety=CHANGES_NUMERICS,
        tolerance=1e-2,
        fixes=("NORM001", "ELEM001", "FUSE001", "FUSE002"),
        applies=applies,
        patch=patch,
        needs_gpu=True,
        runs_on_cpu=False,  # Liger's kernels are Triton kernels
        known_problems=(
            "torch.compile (whole model or compile-blocks) over the Liger-patched model fails in "
            "dynamo on torch 2.11: each lever refuses when the other is applied"
        ),
    )
)
