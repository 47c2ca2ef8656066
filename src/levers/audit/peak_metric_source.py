"""Static reading of the code around a memory-metric call: would the peak be reset on a GPU?

A step may reset the peak counter only on some paths (``if torch.cuda.is_available():``), so a
CPU capture records no reset call although the code resets it on a GPU. The function enclosing
the metric call is parsed; each call to ``reset_peak_memory_stats`` or
``reset_max_memory_allocated`` in it counts unless an enclosing ``if`` is false on a GPU.

Guards are evaluated with three values (true, false, unknown): ``torch.cuda.is_available()`` and
``x.type == "cuda"`` are true on a GPU; names and attribute chains are looked up, without running
any code (``inspect.getattr_static``), in the function's scope when the caller supplies it (its
globals and closure); anything else is unknown, and an unknown guard counts as reachable.
"""

from __future__ import annotations

import ast
import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any

RESET_NAMES = ("reset_peak_memory_stats", "reset_max_memory_allocated")
UNKNOWN = None  # the third truth value

Scope = Mapping[str, Any]
ScopeKey = tuple[str, str]  # (file, function name)


def function_scope(fn: Callable) -> tuple[ScopeKey, dict[str, Any]]:
    """((file, name), globals + closure variables) of a plain Python function."""
    code = fn.__code__
    scope = dict(getattr(fn, "__globals__", {}))
    for name, cell in zip(code.co_freevars, fn.__closure__ or ()):
        try:
            scope[name] = cell.cell_contents
        except ValueError:  # an empty cell
            continue
    return (code.co_filename, code.co_name), scope


@functools.lru_cache(maxsize=64)
def _tree(path: str) -> ast.AST | None:
    try:
        with open(path, encoding="utf-8") as f:
            return ast.parse(f.read(), filename=path)
    except (OSError, SyntaxError, ValueError):
        return None


def _innermost_function(tree: ast.AST, line: int) -> ast.AST | None:
    best = None
    for node in ast.walk(tree):
        inside = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and (
            node.lineno <= line <= (node.end_lineno or node.lineno)
        )
        if inside and (best is None or node.lineno >= best.lineno):
            best = node
    return best


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def _lookup(dotted: str, scope: Scope | None) -> Any:
    if scope is None:
        return UNKNOWN
    head, *rest = dotted.split(".")
    if head not in scope:
        return UNKNOWN
    value = scope[head]
    for attr in rest:
        try:
            value = inspect.getattr_static(value, attr)
        except AttributeError:
            return UNKNOWN
    if isinstance(
        value, (bool, int, float, str, type(None), tuple, list, frozenset, set)
    ):
        return bool(value)
    return UNKNOWN


def evaluate(node: ast.AST, scope: Scope | None) -> bool | None:
    """The truth of a guard on a GPU: True, False or UNKNOWN."""
    if isinstance(node, ast.Constant):
        return bool(node.value)
    if isinstance(node, ast.Call):
        name = _dotted(node.func) or ""
        return True if name.endswith("cuda.is_available") else UNKNOWN
    if isinstance(node, (ast.Name, ast.Attribute)):
        return _lookup(_dotted(node) or "", scope) if _dotted(node) else UNKNOWN
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        inner = evaluate(node.operand, scope)
        return UNKNOWN if inner is UNKNOWN else not inner
    if isinstance(node, ast.BoolOp):
        values = [evaluate(v, scope) for v in node.values]
        if isinstance(node.op, ast.And):
            if any(v is False for v in values):
                return False
            return True if all(v is True for v in values) else UNKNOWN
        if any(v is True for v in values):
            return True
        return False if all(v is False for v in values) else UNKNOWN
    if (
        isinstance(node, ast.Compare)
        and len(node.ops) == 1
        and len(node.comparators) == 1
    ):
        left, right = _dotted(node.left) or "", node.comparators[0]
        if (
            left.endswith(".type")
            and isinstance(right, ast.Constant)
            and right.value == "cuda"
        ):
            return isinstance(node.ops[0], ast.Eq)
    return UNKNOWN


def _guards(scope_node: ast.AST, target: ast.AST) -> list[tuple[ast.expr, bool]]:
    """The ``if`` tests around ``target`` inside ``scope_node``: (test, target is in its body)."""
    found: list[tuple[ast.expr, bool]] = []

    def visit(node: ast.AST) -> bool:
        if node is target:
            return True
        for child in ast.iter_child_nodes(node):
            if visit(child):
                if isinstance(node, ast.If) and child is not node.test:
                    found.append((node.test, child in node.body))
                return True
        return False

    visit(scope_node)
    return found


def _called_name(call: ast.Call) -> str | None:
    func = call.func
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return None


def reset_in_source(
    path: str, line: int, scopes: Mapping[ScopeKey, Scope] | None = None
) -> int | None:
    """The line of a peak reset reachable on a GPU in the function around ``path:line``."""
    tree = _tree(path)
    if tree is None:
        return None
    function = _innermost_function(tree, line)
    scope_node = function or tree
    scope = None
    if scopes is not None and function is not None:
        scope = scopes.get((path, function.name))
    for node in ast.walk(scope_node):
        if not (isinstance(node, ast.Call) and _called_name(node) in RESET_NAMES):
            continue
        verdicts = [
            evaluate(test, scope) for test, in_body in _guards(scope_node, node)
        ]
        in_body = [b for _, b in _guards(scope_node, node)]
        taken = [
            v if b else (UNKNOWN if v is UNKNOWN else not v)
            for v, b in zip(verdicts, in_body)
        ]
        if all(v is not False for v in taken):
            return node.lineno
    return None
