"""Turn a workload spec from the command line into a :class:`levers.Workload`.

A spec is one of:

- a built-in name (``demo``, ``llama``, ``hf``; see :data:`levers.workloads.BUILTINS`),
- ``path/to/file.py:factory`` (``path/to/file.py`` alone calls a function named ``workload``),
- ``package.module:factory`` (imported as usual, from ``sys.path`` and the current directory).

The factory is called with the ``--set key=value`` parameters as keyword arguments. Every way
this can go wrong ends in a :class:`levers.errors.LeversError` whose message says what to do;
where the user's code raised, the error carries the user's frames in ``user_traceback``.
"""

from __future__ import annotations

import ast
import difflib
import hashlib
import importlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from levers.errors import (
    FactoryError,
    LeversError,
    MissingDependency,
    WorkloadNotFound,
    user_traceback,
)
from levers.workload import Workload
from levers.workloads import BUILTINS

# called when a file spec names no factory
DEFAULT_FACTORY = "workload"

_FORMS = (
    "a workload is a built-in name ({builtins}), path/to/file.py:factory, or package.module:factory"
)


def parse_set(items: list[str] | None) -> dict[str, Any]:
    """Parse ``--set key=value`` items into keyword arguments.

    Values are Python literals where they parse as one (``4``, ``1e-3``, ``True``, ``None``,
    ``'a'``, ``[1, 2]``) and plain strings otherwise (``1b``, ``cuda``, ``suffix_attn,norm``).
    A later item overrides an earlier one with the same key (the command line warns: see
    :func:`levers.cli.options.add_set_argument`); an item without a value is refused.
    """
    params: dict[str, Any] = {}
    for item in items or ():
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise LeversError(
                f"--set expects key=value (for example --set batch_size=4), got {item!r}"
            )
        if not key.isidentifier():
            raise LeversError(
                f"--set key {key!r} is not a valid parameter name; use key=value where key is a "
                "Python identifier (for example --set batch_size=4)"
            )
        if not raw.strip():
            raise LeversError(
                f"--set {key}= gives no value; write {key}=VALUE ({key}=\"''\" for an empty "
                "string)"
            )
        params[key] = _parse_value(raw)
    return params


def _parse_value(raw: str) -> Any:
    try:
        return ast.literal_eval(raw)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return raw


def load_workload(spec: str, params: dict[str, Any] | None = None) -> Workload:
    """Resolve ``spec`` to a factory, call it with ``params`` and check that it gave a Workload."""
    params = dict(params or {})
    factory, label, is_builtin, search_dir = _resolve(spec)
    with _on_sys_path(search_dir):
        workload = _call_factory(factory, params, label, is_builtin)
    # a factory that leaves name/params at their defaults still gets an informative report
    if workload.name == "workload":
        workload.name = spec if is_builtin else label
    if not workload.params:
        workload.params = params
    return workload


def call_factory(factory: Callable[..., Any], params: dict[str, Any] | None = None) -> Workload:
    """Call a factory function with ``params``, checked as a spec's factory is."""
    label = getattr(factory, "__name__", "factory")
    return _call_factory(factory, dict(params or {}), label, False)


def resolve_factory(spec: str) -> Callable[..., Any]:
    """The factory that ``spec`` names, without calling it (a bad spec raises here, early)."""
    return _resolve(spec)[0]


def _resolve(spec: str) -> tuple[Callable[..., Any], str, bool, str | None]:
    """Return (factory, label for messages, is_builtin, directory to keep on sys.path)."""
    spec = spec.strip()
    if spec in BUILTINS:
        module_name, _, attr = BUILTINS[spec].partition(":")
        if importlib.util.find_spec(module_name) is None:
            raise WorkloadNotFound(
                f"the built-in workload {spec!r} is missing from this installation of levers "
                f"(no module {module_name}); reinstall levers"
            )
        module = _import_module(module_name, spec)
        return _get_factory(module, attr, spec, explicit=True), spec, True, None
    _check_colon(spec)
    target, attr = _split_spec(spec)
    # a directory reads the same with or without its trailing slash
    if _looks_like_path(target) or Path(target).expanduser().is_dir():
        path = Path(target).expanduser()
        _check_file_defines(path, attr or DEFAULT_FACTORY, spec, explicit=bool(attr))
        module = _import_file(path, spec)
        factory = _get_factory(module, attr or DEFAULT_FACTORY, spec, explicit=bool(attr))
        return factory, f"{target}:{attr or DEFAULT_FACTORY}", False, str(path.resolve().parent)
    if attr is None:
        raise WorkloadNotFound(_unknown_builtin_message(spec))
    # like `python -m`, pytest and uvicorn: a module in the current directory is importable
    cwd = os.getcwd()
    with _on_sys_path(cwd):
        module = _import_module(target, spec)
    return _get_factory(module, attr, spec, explicit=True), spec, False, cwd


def _check_colon(spec: str) -> None:
    """Refuse a spec with nothing on one side of its colon, saying what goes there."""
    target, sep, attr = spec.rpartition(":")
    if not sep or "/" in attr or "\\" in attr:
        return
    if not target:
        raise WorkloadNotFound(
            f"workload {spec!r} names no file or module before the colon; write "
            f"path/to/file.py:{attr} or package.module:{attr}"
        )
    if not attr:
        path = Path(target).expanduser()
        listed = ""
        if path.suffix == ".py" and path.is_file():
            functions = _module_functions(path)
            listed = f" (functions defined there: {', '.join(functions) if functions else 'none'})"
        raise WorkloadNotFound(
            f"workload {spec!r} names no function after the colon; write {target}:FACTORY, "
            f"FACTORY the function that returns a levers.Workload{listed}"
        )


def _module_functions(path: Path) -> list[str]:
    """The public functions a Python file defines at module level (read, not imported)."""
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except (SyntaxError, ValueError, OSError):
        return []
    return sorted(
        node.name for node in tree.body
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_")
    )


def _split_spec(spec: str) -> tuple[str, str | None]:
    """Split ``target:attr`` at the last colon, leaving a Windows drive letter alone."""
    target, sep, attr = spec.rpartition(":")
    if not sep or not attr or ("/" in attr or "\\" in attr):
        return spec, None
    return target, attr


def file_spec_relative_to(spec: str, directory: str | os.PathLike[str]) -> str:
    """``spec`` with a relative workload file path read from ``directory``; others unchanged."""
    target, attr = _split_spec(spec.strip())
    if spec.strip() in BUILTINS or not _looks_like_path(target):
        return spec
    path = Path(target).expanduser()
    if path.is_absolute():
        return spec
    joined = str(Path(directory) / path)
    return f"{joined}:{attr}" if attr else joined


def looks_like_spec(text: str) -> bool:
    """Whether ``text`` has a workload spec's form (a built-in name, ``file.py:factory``,
    ``package.module:factory``, a path): what a caller that also takes other names (lever ids)
    reads it as, before resolving it."""
    text = text.strip()
    target, attr = _split_spec(text)
    return (
        text in BUILTINS or attr is not None or _looks_like_path(target)
        or Path(target).expanduser().is_dir()
    )


def _looks_like_path(target: str) -> bool:
    return target.endswith(".py") or "/" in target or os.sep in target


def _unknown_builtin_message(spec: str) -> str:
    names = sorted(BUILTINS)
    lines = [f"unknown workload {spec!r}."]
    close = difflib.get_close_matches(spec, names, n=3, cutoff=0.6)
    if close:
        lines.append(f"Did you mean {' or '.join(repr(c) for c in close)}?")
    lines.append(_FORMS.format(builtins=", ".join(names)) + ".")
    if "." in spec and importlib.util.find_spec(spec.split(".")[0]) is not None:
        lines.append(f"To use a function from module {spec!r}, write {spec}:FACTORY.")
    elif Path(spec + ".py").is_file():
        lines.append(f"To use the file {spec}.py, write {spec}.py:FACTORY.")
    return " ".join(lines)


def _import_file(path: Path, spec: str) -> Any:
    if path.is_dir():
        raise WorkloadNotFound(
            f"workload {str(path)!r} is a directory; name a Python file in it "
            f"({str(path / 'train.py')}:factory) or a module (package.module:factory)"
        )
    if not path.is_file():
        hint = "" if path.suffix == ".py" else " (a workload file must end in .py)"
        raise WorkloadNotFound(
            f"workload file {str(path)!r} does not exist{hint}; check the path, which is "
            f"relative to the current directory ({os.getcwd()})"
        )
    resolved = path.resolve()
    # a unique name per file, so two workload files called model.py do not replace each other
    digest = hashlib.sha1(str(resolved).encode()).hexdigest()[:10]
    module_name = f"levers_user_{_identifier(resolved.stem)}_{digest}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    import_spec = importlib.util.spec_from_file_location(module_name, resolved)
    if import_spec is None or import_spec.loader is None:
        raise WorkloadNotFound(f"cannot import {str(path)!r} as Python; use a .py file")
    module = importlib.util.module_from_spec(import_spec)
    # registered before running, as a normal import does, so dataclasses and pickling work
    sys.modules[module_name] = module
    try:
        with _on_sys_path(str(resolved.parent)):
            import_spec.loader.exec_module(module)
    except BaseException as exc:  # noqa: BLE001 - user code may raise anything; translated below
        del sys.modules[module_name]
        _raise_import_failure(exc, str(path), spec, own_module=None)
    return module


def _check_file_defines(path: Path, attr: str, spec: str, *, explicit: bool) -> None:
    """Refuse a workload file that does not define ``attr`` before running any of it.

    Importing a file runs its module level; a training script that trains there (no
    ``if __name__ == "__main__":`` guard) would train to its end before levers could say it has
    no factory. The file's syntax tree says whether the name is bound at module level (a
    ``def``, a class, an assignment or an import, also under a top-level ``if`` or ``try``); a
    module-level ``__getattr__`` or a star import may bind it at run time, so those are imported.
    """
    if not path.is_file():
        return  # _import_file says what is wrong with the path
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except (SyntaxError, ValueError):
        return  # the import reports the syntax error with its traceback
    bound, dynamic = _module_level_names(tree.body)
    if attr in bound or dynamic:
        return
    functions = _module_functions(path)
    listed = ", ".join(functions) if functions else "none"
    if explicit:
        head = f"{path} has no attribute {attr!r} at module level (workload {spec!r})"
    else:
        head = (
            f"{path} defines no function named {attr!r}, the default factory; name one with "
            f"{spec}:FACTORY"
        )
    raise WorkloadNotFound(
        f"{head}; levers did not import it (a script that trains at module level would have run "
        f"its training). To audit the script as it is, run levers audit -- python {path}; to "
        "A/B levers on it, add a factory that returns levers.Workload(model=..., step=...) "
        "(README.md, section Workloads), or apply them in the script with "
        f'levers.apply(model, "LEVER,...", optimizer=optimizer). Functions defined there: {listed}'
    )


def _module_level_names(body: list[ast.stmt]) -> tuple[set[str], bool]:
    """Names bound by statements at module level (through top-level if/try/with blocks), and
    whether the module may bind names at run time (``__getattr__``, ``from x import *``)."""
    names: set[str] = set()
    dynamic = False
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            dynamic |= node.name == "__getattr__"
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name == "*":
                    dynamic = True
                names.add((alias.asname or alias.name).split(".")[0])
        elif isinstance(node, (ast.If, ast.Try, ast.With, ast.For, ast.While)):
            inner = [*node.body, *getattr(node, "orelse", []), *getattr(node, "finalbody", [])]
            for handler in getattr(node, "handlers", []):
                inner += handler.body
            more, more_dynamic = _module_level_names(inner)
            names |= more
            dynamic |= more_dynamic
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.NamedExpr):
            names.add(node.value.target.id)
    return names, dynamic


def _identifier(text: str) -> str:
    return "".join(c if c.isalnum() or c == "_" else "_" for c in text)


def _import_module(module_name: str, spec: str) -> Any:
    try:
        return importlib.import_module(module_name)
    except BaseException as exc:  # noqa: BLE001 - user code may raise anything; translated below
        _raise_import_failure(exc, module_name, spec, own_module=module_name)


def _raise_import_failure(exc: BaseException, where: str, spec: str, own_module: str | None):
    """Turn an exception raised while importing a workload into a LeversError."""
    if isinstance(exc, LeversError):
        raise exc
    if not isinstance(exc, Exception):  # KeyboardInterrupt, SystemExit: not ours to translate
        raise exc
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        if own_module is not None and _is_package_prefix(exc.name, own_module):
            raise WorkloadNotFound(
                f"cannot import module {own_module!r} for workload {spec!r}: no module named "
                f"{exc.name!r}. Check the spelling and that its package is installed or on "
                f"PYTHONPATH (the current directory is {os.getcwd()}); for a file, write "
                "path/to/file.py:FACTORY"
            ) from None
        top = exc.name.split(".")[0]
        raise MissingDependency(
            f"workload {spec!r} needs the module {exc.name!r}, which is not installed "
            f"(imported from {where}); install it, e.g. pip install {top}",
            user_traceback=user_traceback(exc),
        ) from None
    raise FactoryError(
        f"importing {where} for workload {spec!r} raised {type(exc).__name__}: {exc}; fix the "
        "error shown in the traceback",
        user_traceback=user_traceback(exc),
    ) from None


def _is_package_prefix(missing: str, module_name: str) -> bool:
    """True if ``missing`` is ``module_name`` or one of its parent packages."""
    return module_name == missing or module_name.startswith(missing + ".")


def _get_factory(module: Any, attr: str, spec: str, *, explicit: bool) -> Callable[..., Any]:
    try:
        factory = getattr(module, attr)
    except AttributeError:
        where = getattr(module, "__file__", None) or module.__name__
        candidates = factory_candidates(module)
        listed = ", ".join(candidates) if candidates else "none"
        if explicit:
            head = f"{where} has no attribute {attr!r} (workload {spec!r})"
        else:
            head = (
                f"{where} has no function named {attr!r}, the default factory; name one with "
                f"{spec}:FACTORY"
            )
        raise WorkloadNotFound(f"{head}. Functions defined there: {listed}") from None
    if not callable(factory):
        raise FactoryError(
            f"{attr!r} in workload {spec!r} is a {type(factory).__name__}, not a callable; point "
            "the spec at a function that returns levers.Workload(model=..., step=...)"
        )
    return factory


def factory_candidates(module: Any) -> list[str]:
    """Public functions defined in ``module`` itself (not imported into it), sorted."""
    names = []
    for name, obj in vars(module).items():
        if name.startswith("_") or not inspect.isfunction(obj):
            continue
        if getattr(obj, "__module__", None) == module.__name__:
            names.append(name)
    return sorted(names)


def _call_factory(
    factory: Callable[..., Any], params: dict[str, Any], label: str, is_builtin: bool
) -> Workload:
    _check_binding(factory, params, label)
    try:
        workload = factory(**params)
    except LeversError:
        raise  # already says what to do (a missing optional dependency, for one)
    except Exception as exc:  # noqa: BLE001 - the user's factory may raise anything
        if is_builtin and isinstance(exc, (ValueError, TypeError)):
            # a built-in's own parameter check: its message is the whole story
            raise FactoryError(f"workload {label!r}: {exc}") from None
        raise FactoryError(
            f"the factory for workload {label!r} raised {type(exc).__name__}: {exc}",
            user_traceback=user_traceback(exc),
        ) from None
    if not isinstance(workload, Workload):
        raise FactoryError(
            f"the factory for workload {label!r} returned {type(workload).__name__}, not a "
            "levers.Workload; return levers.Workload(model=..., step=..., tokens_per_step=..., "
            "optimizer=...)"
        )
    return workload


def _check_binding(factory: Callable[..., Any], params: dict[str, Any], label: str) -> None:
    """Reject parameters the factory does not take, before running any of its code."""
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):  # some callables (C functions) have no signature
        return
    try:
        signature.bind(**params)
    except TypeError as exc:
        raise FactoryError(
            f"workload {label!r} does not accept these parameters ({exc}). "
            f"It accepts: {describe_parameters(signature)}; pass them with --set key=value"
        ) from None


def describe_parameters(signature: inspect.Signature) -> str:
    """``a, b=1, c='x'`` for a factory's keyword-capable parameters."""
    parts = []
    for p in signature.parameters.values():
        if p.kind is p.VAR_KEYWORD:
            parts.append(f"**{p.name}")
        elif p.kind is p.VAR_POSITIONAL or p.kind is p.POSITIONAL_ONLY:
            continue
        elif p.default is p.empty:
            parts.append(f"{p.name} (required)")
        else:
            parts.append(f"{p.name}={p.default!r}")
    return ", ".join(parts) if parts else "no parameters"


@contextmanager
def workload_argv(spec: str | None) -> Iterator[None]:
    """``sys.argv`` as ``python FILE`` would set it, while the workload's code runs.

    A factory taken from a training script often parses the command line; under levers it would
    read levers' own options and fail with a usage line that names levers. It sees only the
    script's name (its argparse defaults), as when the script runs with no arguments.
    """
    if spec is None:
        yield
        return
    target, _ = _split_spec(spec.strip())
    saved = sys.argv
    sys.argv = [target]
    try:
        yield
    finally:
        sys.argv = saved


@contextmanager
def _on_sys_path(directory: str | None) -> Iterator[None]:
    """Put ``directory`` first on sys.path, so a workload file can import its siblings."""
    if directory is None or directory in sys.path:
        yield
        return
    sys.path.insert(0, directory)
    try:
        yield
    finally:
        try:
            sys.path.remove(directory)
        except ValueError:
            pass
