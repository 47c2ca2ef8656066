"""The import graph of src/levers: no cycle at module level, no private name imported from
another package, and a base errors module that imports nothing heavy."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import levers

ROOT = Path(levers.__file__).parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _top_level_imports(tree: ast.Module):
    """Import statements that run when the module is imported (not in functions, not for
    type checking only)."""
    pending = list(tree.body)
    while pending:
        node = pending.pop(0)
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If) and not _is_type_checking(node):
            pending.extend(node.body + node.orelse)
        elif isinstance(node, ast.Try):
            pending.extend(node.body + node.orelse + node.finalbody)
            for handler in node.handlers:
                pending.extend(handler.body)


def _absolute(module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
    for _ in range(node.level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{node.module}" if node.module else package


def _edges(module: str) -> set[str]:
    tree = ast.parse(MODULES[module].read_text())
    targets: set[str] = set()
    for node in _top_level_imports(tree):
        if isinstance(node, ast.Import):
            targets.update(a.name for a in node.names)
            continue
        base = _absolute(module, node)
        for alias in node.names:
            child = f"{base}.{alias.name}"
            targets.add(child if child in MODULES else base)
    return {t for t in targets if t in MODULES and t != module}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path, or None (iterative depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for start in graph:
        if state.get(start):
            continue
        path, stack = [start], [iter(sorted(graph[start]))]
        state[start] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            elif not state.get(nxt):
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(graph[nxt])))
    return None


def test_the_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_no_import_cycle_at_module_level():
    graph = {m: _edges(m) for m in MODULES}
    assert _cycle(graph) is None


def _package(module: str) -> str:
    return module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]


def test_no_private_name_is_imported_from_another_package():
    offenders = []
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom):
                continue
            base = _absolute(module, node)
            # a package's private names are its own and its sub-packages'
            if base not in MODULES or _package(module) == _package(base) or _package(
                module
            ).startswith(_package(base) + "."):
                continue
            offenders += [
                f"{module} imports {base}.{a.name}"
                for a in node.names
                if a.name.startswith("_") and not a.name.startswith("__")
            ]
    assert offenders == []


def test_the_base_errors_module_imports_nothing_heavy():
    # `import levers` itself brings torch (levers.Workload holds a module); the errors module,
    # which every layer imports, must add no other part of levers and no rendering library
    code = (
        "import sys, levers; before = set(sys.modules); import levers.errors; "
        "print(sorted(m for m in set(sys.modules) - before "
        "if m.startswith(('levers.', 'rich', 'transformers'))))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout == "['levers.errors', 'levers.user_code']\n"
