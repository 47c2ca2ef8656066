"""What ``levers list`` shows of each lever, read without importing the lever modules.

A lever module imports torch (and some import Liger or compile machinery), which costs seconds;
the catalogue's metadata is literal in each module's ``register(Lever(...))`` call. This module
reads those keywords from the module's source (names bound at module level to literals, and the
safety words of :mod:`levers.vocab`, are resolved). Where a keyword is not a literal, the module
is imported and its registered lever read instead: the answer is the same either way
(``tests/cli/test_startup.py`` checks it for every lever), only slower.
"""

from __future__ import annotations

import ast
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from levers import vocab
from levers.levers import _MODULES

# the fields of levers.levers.lever.Lever that the listing shows
_FIELDS = ("id", "title", "safety", "tolerance", "fixes", "needs_gpu", "known_problems")
_DEFAULTS: dict[str, Any] = {"tolerance": None, "needs_gpu": False, "known_problems": ""}


@dataclass(frozen=True)
class LeverInfo:
    id: str
    title: str
    safety: str
    tolerance: float | None
    fixes: tuple[str, ...]
    needs_gpu: bool
    known_problems: str


def lever_infos() -> list[LeverInfo]:
    """Every lever of the catalogue, in the catalogue's order."""
    return [_info(f"levers.levers.{name}") for name in _MODULES]


def info_of(lever: Any) -> LeverInfo:
    """The listing's fields of a registered :class:`levers.levers.lever.Lever`."""
    return LeverInfo(**{name: getattr(lever, name) for name in _FIELDS})


def _info(module: str) -> LeverInfo:
    read = _read_source(module)
    if read is not None:
        return read
    imported = importlib.import_module(module)  # a computed keyword: ask the lever itself
    return info_of(imported.LEVER)


def _read_source(module: str) -> LeverInfo | None:
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        return None
    try:
        tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    except (OSError, SyntaxError):
        return None
    names = _module_literals(tree)
    for node in ast.walk(tree):
        if _is_call(node, "Lever"):
            keywords = {k.arg: k.value for k in node.keywords if k.arg in _FIELDS}
            values = dict(_DEFAULTS)
            for key, value in keywords.items():
                resolved = _literal(value, names)
                if resolved is _UNKNOWN:
                    return None
                values[key] = resolved
            if not all(name in values for name in _FIELDS):
                return None
            values["fixes"] = tuple(values["fixes"])
            return LeverInfo(**values)
    return None


_UNKNOWN = object()


def _is_call(node: ast.AST, name: str) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == name


def _module_literals(tree: ast.Module) -> dict[str, Any]:
    names: dict[str, Any] = {
        name: getattr(vocab, name) for name in dir(vocab) if name.isupper()
    }
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name):
                value = _literal(node.value, names)
                if value is not _UNKNOWN:
                    names[target.id] = value
    return names


def _literal(node: ast.AST, names: dict[str, Any]) -> Any:
    if isinstance(node, ast.Name):
        return names.get(node.id, _UNKNOWN)
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, RecursionError):
        pass
    if isinstance(node, (ast.Tuple, ast.List)):
        items = [_literal(item, names) for item in node.elts]
        return _UNKNOWN if any(i is _UNKNOWN for i in items) else tuple(items)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _literal(node.left, names), _literal(node.right, names)
        if left is _UNKNOWN or right is _UNKNOWN:
            return _UNKNOWN
        try:
            return left + right
        except TypeError:
            return _UNKNOWN
    return _UNKNOWN
