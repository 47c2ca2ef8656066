"""Where a family of repeated blocks is called: the ``block(x)`` line inside ``for block in self.blocks``.

The capture records the innermost user frame of each op, which for a block's ops is inside the
block; the loop that calls the blocks (where checkpointing would wrap them) is found by reading
the source files the step ran: a ``for`` over ``self.<attribute>`` (possibly sliced or zipped)
whose body calls the loop variable.
"""

from __future__ import annotations

import ast
import functools
import linecache
from collections.abc import Iterable

from levers.capture.records import SourceLoc


@functools.lru_cache(maxsize=64)
def _tree(path: str) -> ast.AST | None:
    try:
        with open(path, encoding="utf-8") as f:
            return ast.parse(f.read(), filename=path)
    except (OSError, SyntaxError, ValueError):
        return None


def _iterates_attribute(node: ast.expr, attribute: str) -> bool:
    return any(
        isinstance(n, ast.Attribute) and n.attr == attribute for n in ast.walk(node)
    )


def _target_names(target: ast.expr) -> set[str]:
    return {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}


def _function_of(tree: ast.AST, node: ast.AST) -> str:
    best = "<module>"
    for fn in ast.walk(tree):
        if isinstance(
            fn, (ast.FunctionDef, ast.AsyncFunctionDef)
        ) and fn.lineno <= node.lineno <= (fn.end_lineno or fn.lineno):
            best = fn.name
    return best


def block_call_sites(files: Iterable[str], attribute: str) -> list[SourceLoc]:
    """Lines calling the loop variable of ``for x in self.<attribute>...`` in ``files``."""
    sites: list[SourceLoc] = []
    for path in sorted(set(files)):
        tree = _tree(path)
        if tree is None:
            continue
        for loop in ast.walk(tree):
            if not isinstance(loop, ast.For) or not _iterates_attribute(
                loop.iter, attribute
            ):
                continue
            names = _target_names(loop.target)
            for node in ast.walk(loop):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Name)
                    and node.func.id in names
                ):
                    code = linecache.getline(path, node.lineno).strip()
                    sites.append(
                        SourceLoc(path, node.lineno, _function_of(tree, node), code)
                    )
    return sites
