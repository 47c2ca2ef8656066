"""The names a running script gives its model and optimizer, for the ``levers.apply(...)`` line
that levers prints for it.

    names = find_names(model, optimizer)   # inside an optimizer hook of the script's run
    names.to_dict()  # {"model": "net", "optimizer": "opt", "trainer": None, ...}

Called from an optimizer step hook, so the script's frames are on the stack. They are searched
from the innermost outwards, the script's own files only (not torch, levers or an installed
library, whose names the user did not write), for a variable that holds the object itself
(``net``), else one of whose attributes or submodules holds it (``self.model``, ``model.net`` of
a LightningModule, ``ddp.module``). A Hugging Face ``Trainer`` running the loop (a frame of its
own methods is on the stack) is said too: its script applies levers through the Trainer, not to
a model and an optimizer the script never names.
"""

from __future__ import annotations

import sys
import types
from dataclasses import asdict, dataclass
from types import FrameType
from typing import Any

import torch

from levers.audit.script_step import HF_TRAINER
from levers.user_code import is_script_file


@dataclass(frozen=True)
class ScriptNames:
    """The script's expressions for the model and optimizer levers found (None: none found)."""

    model: str | None
    optimizer: str | None
    model_class: str
    optimizer_class: str
    framework: str | None = None  # HF_TRAINER when a Hugging Face Trainer runs the loop
    trainer: str | None = None  # the script's variable holding that Trainer

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def find_names(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, frame: FrameType | None = None
) -> ScriptNames:
    """The names of ``model`` and ``optimizer`` in the script's frames, from ``frame`` (default:
    the caller's) outwards."""
    frame = frame if frame is not None else sys._getframe(1)
    frames = []
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back
    trainer = next((t for t in map(_hf_trainer, frames) if t is not None), None)
    # the Trainer's own methods (a subclass's in the script too) name things as the library does
    script_frames = [
        f for f in frames
        if is_script_file(f.f_code.co_filename)
        and (trainer is None or f.f_locals.get("self") is not trainer)
    ]
    return ScriptNames(
        model=_name_of(model, script_frames),
        optimizer=_name_of(optimizer, script_frames),
        model_class=type(model).__name__,
        optimizer_class=type(optimizer).__name__,
        framework=HF_TRAINER if trainer is not None else None,
        trainer=_name_of(trainer, script_frames) if trainer is not None else None,
    )


def _hf_trainer(frame: FrameType) -> Any:
    """The Hugging Face Trainer whose method this frame runs, or None."""
    obj = frame.f_locals.get("self")
    if obj is None:
        return None
    is_trainer = any(
        cls.__name__ == "Trainer" and cls.__module__.startswith("transformers.")
        for cls in type(obj).__mro__
    )
    return obj if is_trainer else None


def _name_of(obj: Any, frames: list[FrameType]) -> str | None:
    """The innermost frame's variable holding ``obj``, else one whose attribute holds it."""
    for frame in frames:
        variables = [(k, v) for k, v in frame.f_locals.items() if not k.startswith("__")]
        direct = next((name for name, value in variables if value is obj), None)
        if direct is not None:
            return direct
        for name, value in variables:
            attribute = _attribute_holding(value, obj)
            if attribute is not None:
                return f"{name}.{attribute}"
    return None


def _attribute_holding(value: Any, obj: Any) -> str | None:
    """The attribute (or registered submodule) of ``value`` that is ``obj``, or None."""
    try:
        if isinstance(value, (type, types.ModuleType)) or (
            callable(value) and not isinstance(value, torch.nn.Module)
        ):
            return None  # classes, functions, imported modules: not the script's objects
        attributes = dict(vars(value))
    except Exception:  # noqa: BLE001 - no __dict__, or a proxy whose referent is gone
        return None
    attributes.update(attributes.get("_modules") or {})
    return next(
        (name for name, held in attributes.items() if held is obj and not name.startswith("_")),
        None,
    )
