"""The import graph of src/levers, counting every import (function-local ones too; only
``if TYPE_CHECKING:`` blocks are left out): no module cycle, no package cycle, no private name
imported from another package, argparse only under cli/, and a base errors module that imports
nothing heavy; imports at the module top, but for the listed reasons; the version in a leaf
module."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

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


def _all_imports(tree: ast.Module):
    """Every import statement of a module, at any depth (functions, classes, branches), except
    those under ``if TYPE_CHECKING:``, which never run. A function-local import hides a cycle
    from Python's import machinery, not from this graph."""
    pending: list[ast.AST] = [tree]
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If) and _is_type_checking(node):
            pending.extend(node.orelse)
        else:
            pending.extend(ast.iter_child_nodes(node))


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
    for node in _all_imports(tree):
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


def test_imports_inside_functions_are_counted():
    tree = ast.parse(
        "import a\n"
        "def f():\n    import b\n"
        "class C:\n    def g(self):\n        from c import d\n"
        "if TYPE_CHECKING:\n    import e\nelse:\n    import f\n"
    )
    found = sorted(
        a.name if isinstance(n, ast.Import) else n.module
        for n in _all_imports(tree) for a in n.names
    )
    assert found == ["a", "b", "c", "f"]


GRAPH = {m: _edges(m) for m in MODULES}


def test_no_module_cycle():
    assert _cycle(GRAPH) is None


def _top_package(module: str) -> str:
    """``levers.audit.rules.attn001`` -> ``levers.audit``; a module directly under levers/
    (``levers.api``, ``levers.hardware``) is a node of its own."""
    parts = module.split(".")
    if len(parts) > 1 and (ROOT / parts[1]).is_dir():
        return ".".join(parts[:2])
    return module


def test_no_package_cycle():
    # the layers of DESIGN.md: capture, then audit/memory; levers, then ab, then tune; cli/ on top
    packages: dict[str, set[str]] = {}
    for module, targets in GRAPH.items():
        here = _top_package(module)
        packages.setdefault(here, set()).update(
            t for t in map(_top_package, targets) if t != here
        )
    for target in {t for ts in packages.values() for t in ts}:
        packages.setdefault(target, set())
    assert _cycle(packages) is None


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


def test_argparse_is_imported_only_under_cli():
    # the command line lives in levers/cli/ alone; every other layer is called with values
    offenders = []
    for module, path in MODULES.items():
        if module == "levers.cli" or module.startswith("levers.cli."):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names] if isinstance(node, ast.Import)
                else [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            )
            offenders += [f"{module} imports {n}" for n in names if n.split(".")[0] == "argparse"]
    assert offenders == []


def test_the_help_imports_no_torch():
    # `levers --help` and a usage error answer in well under a second: no torch behind the parser
    code = (
        "import sys; from levers.cli import build_parser; build_parser(); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout == "[]\n"


# --- function-local imports ----------------------------------------------------------------------
# STYLE.md: a function-local import is for start-up cost only, never to hide a cycle. A module
# imports at its top, except for:
# optional packages, imported where they are used (levers.optional): levers runs without them
OPTIONAL_PACKAGES = {
    "accelerate", "cut_cross_entropy", "lightning", "liger_kernel", "pytorch_lightning", "timm",
    "torchao", "transformers",
    "tomli", "tomllib",  # TOML: tomllib from Python 3.11, tomli (if installed) before
}
# parts of torch that take seconds to import, which only a compiled (or FSDP) step needs
HEAVY_TORCH = ("torch._dynamo", "torch._inductor", "functorch", "torch.distributed.fsdp")
# every audit imports every lever module (levers.levers.load_all): a lever imports the memory
# model when it predicts (levers/levers/__init__.py)
MEMORY_MODEL = ("levers.memory.fit", "levers.memory.predict", "levers.memory.prediction")
# a lever module imported by name, after load_all()
LEVER_ORDER = ("a lever module registers itself on import, and the catalogue's order is the "
               "order its modules are first imported in")
# module -> {imported module: why it is imported inside a function}
LOCAL_IMPORTS_ALLOWED = {
    "levers.workload": {"torch": "`levers --help` reads the Workload record without torch"},
    "levers.audit.rules.dtype002_fp32_grouped_mm": {
        "levers.capture.ops": "it imports torch, and `levers rule` loads every rule without it",
    },
    "levers.tune.run": {"levers.levers.compile_model": LEVER_ORDER},
    "levers.ab.runner": {"levers.levers.compile_model": LEVER_ORDER},
    "levers.workloads._params": {
        "torch._guards": "a private module, asked for under try: a torch that moved it loses a "
        "convenience only",
    },
}


def _function_local_imports(tree: ast.Module):
    """Every import statement inside a function (methods and nested functions too)."""
    pending: list[tuple[ast.AST, bool]] = [(tree, False)]
    while pending:
        node, in_function = pending.pop()
        if in_function and isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        inside = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        pending.extend((child, inside) for child in ast.iter_child_nodes(node))


def test_function_local_imports_are_found():
    tree = ast.parse(
        "import a\n"
        "def f():\n    import b\n    def g():\n        from c import d\n"
        "class C:\n    import e\n    def h(self):\n        try:\n            import f\n"
        "        except ImportError:\n            pass\n"
    )
    found = sorted(
        a.name if isinstance(n, ast.Import) else n.module
        for n in _function_local_imports(tree) for a in n.names
    )
    assert found == ["b", "c", "f"]


def _local_import_allowed(module: str, imported: str) -> bool:
    if module == "levers.cli" or module.startswith("levers.cli."):
        return True  # `levers --help` loads every verb module, without torch (levers/cli)
    if imported.split(".")[0] in OPTIONAL_PACKAGES:
        return True
    if any(imported == heavy or imported.startswith(heavy + ".") for heavy in HEAVY_TORCH):
        return True
    if module.startswith("levers.levers.") and imported in MEMORY_MODEL:
        return True
    return imported in LOCAL_IMPORTS_ALLOWED.get(module, {})


def test_imports_are_at_the_module_top():
    offenders = []
    for module, path in MODULES.items():
        for node in _function_local_imports(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names] if isinstance(node, ast.Import)
                else [_absolute(module, node)]
            )
            offenders += [
                f"{module}:{node.lineno} imports {name} inside a function"
                for name in names if not _local_import_allowed(module, name)
            ]
    assert offenders == [], (
        "move these imports to the top of their modules. An import stays inside a function only "
        "for start-up cost (levers/cli: `levers --help` without torch; HEAVY_TORCH; MEMORY_MODEL "
        "in a lever), for an optional package (OPTIONAL_PACKAGES), or with its reason in "
        "LOCAL_IMPORTS_ALLOWED (tests/test_imports.py); a cycle is broken by moving code, not "
        "hidden by a local import:\n"
        + "\n".join(offenders)
    )


def test_every_allowed_local_import_is_still_there():
    # an entry whose import moved to the top (or whose module went) is stale: remove it
    present = set()
    for module, path in MODULES.items():
        for node in _function_local_imports(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names] if isinstance(node, ast.Import)
                else [_absolute(module, node)]
            )
            present.update((module, name) for name in names)
    stale = [
        (module, imported)
        for module, imports in LOCAL_IMPORTS_ALLOWED.items() for imported in imports
        if (module, imported) not in present
    ]
    assert stale == []


# --- the version -----------------------------------------------------------------------------------


def test_the_version_is_defined_once_in_a_leaf_module():
    import levers._version

    tomllib = pytest.importorskip("tomllib")
    tree = ast.parse(MODULES["levers._version"].read_text())
    assert not [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert levers.__version__ == levers._version.__version__
    path = ROOT.parents[1] / "pyproject.toml"
    if not path.is_file():
        pytest.skip("levers is imported from an installation, not from the repository")
    pyproject = tomllib.loads(path.read_text())
    assert "version" not in pyproject["project"]
    assert "version" in pyproject["project"]["dynamic"]
    assert pyproject["tool"]["setuptools"]["dynamic"]["version"] == {
        "attr": "levers._version.__version__"
    }
