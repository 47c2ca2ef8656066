"""Reversible patching: every change a lever makes goes through here, so its undo is exact.

``set_attr`` remembers whether the attribute lived in the object's own ``__dict__`` (an instance
``forward`` set by a lever, say) or came from its class, and the undo puts back exactly that:
the old value, or no instance attribute at all. ``Undos`` runs undos in reverse order.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

Undo = Callable[[], None]

_MISSING = object()


def set_attr(obj: Any, name: str, value: Any) -> Undo:
    """``setattr(obj, name, value)``, and the undo that restores the attribute as it was."""
    own = getattr(obj, "__dict__", {})
    before = own.get(name, _MISSING) if isinstance(own, dict) else _MISSING
    had_own = before is not _MISSING
    if not had_own:
        before = getattr(obj, name, _MISSING)
    setattr(obj, name, value)

    def undo() -> None:
        if had_own:
            setattr(obj, name, before)
        elif name in getattr(obj, "__dict__", {}):
            delattr(obj, name)
        elif before is not _MISSING:
            # a property or a slot: the class held it, and it was set through it
            setattr(obj, name, before)

    return undo


class Undos:
    """Undos collected while patching, run in reverse order (last change undone first)."""

    def __init__(self) -> None:
        self._undos: list[Undo] = []

    def add(self, undo: Undo) -> None:
        self._undos.append(undo)

    def set_attr(self, obj: Any, name: str, value: Any) -> None:
        self.add(set_attr(obj, name, value))

    def __len__(self) -> int:
        return len(self._undos)

    def __call__(self) -> None:
        while self._undos:
            self._undos.pop()()


def wrap_forward(module: Any, wrapper: Callable[[Callable[..., Any]], Callable[..., Any]]) -> Undo:
    """Set ``module.forward`` to ``wrapper(current forward)`` on the instance; returns the undo.

    The new forward carries the old one's name and signature (``functools.update_wrapper``):
    code that reads the forward's parameters still finds them (a Hugging Face Trainer keeps the
    dataset's columns the forward names, and drops the rest)."""
    forward = module.forward
    return set_attr(module, "forward", functools.update_wrapper(wrapper(forward), forward))
