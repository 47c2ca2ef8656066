"""User code: one definition, for source lines, error tracebacks and the memory model's sites.

"User code" is every frame outside torch, levers' own machinery and the standard library. The
built-in workloads under ``levers/workloads`` are user code: they are models a reader audits.
Installed libraries (transformers, timm, ...) are user code too.

Imports nothing heavy (torch's folder is found without importing it), so that the base errors
module can use it.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import sysconfig


def _torch_dir() -> str:
    spec = importlib.util.find_spec("torch")
    origin = spec.origin if spec is not None and spec.origin else ""
    return os.path.dirname(os.path.abspath(origin)) + os.sep if origin else "<no torch>"


TORCH_DIR = _torch_dir()
_LEVERS_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_WORKLOADS_DIR = os.path.join(_LEVERS_DIR, "workloads") + os.sep
_STDLIB_DIRS = tuple(
    {os.path.join(sysconfig.get_paths()[key], "") for key in ("stdlib", "platstdlib")}
)
# installed libraries (transformers, timm, ...) are user code, though in a virtual environment
# their site-packages folder lies inside a standard-library folder
_SITE_DIRS = tuple(
    {os.path.join(sysconfig.get_paths()[key], "") for key in ("purelib", "platlib")}
    | {os.path.join(p, "") for p in sys.path if os.path.basename(p.rstrip(os.sep)) in ("site-packages", "dist-packages")}
)

# filename -> whether frames in it are user code
_is_user_file: dict[str, bool] = {}


def is_user_file(filename: str) -> bool:
    """Whether frames in ``filename`` are the user's code."""
    known = _is_user_file.get(filename)
    if known is not None:
        return known
    path = os.path.abspath(filename) if not filename.startswith("<") else filename
    user = not (
        filename.startswith("<frozen")  # the import machinery
        or path.startswith(TORCH_DIR)
        or (path.startswith(_LEVERS_DIR) and not path.startswith(_WORKLOADS_DIR))
        or (path.startswith(_STDLIB_DIRS) and not path.startswith(_SITE_DIRS))
    )
    _is_user_file[filename] = user
    return user


def is_script_file(filename: str) -> bool:
    """Whether frames in ``filename`` are the user's own code, not an installed library's: the
    frames whose variable names the user wrote (a Trainer's inner loop is user code, but its
    names are the library's)."""
    if not is_user_file(filename):
        return False
    path = os.path.abspath(filename) if not filename.startswith("<") else filename
    return not path.startswith(_SITE_DIRS)


def is_builtin_workload_file(filename: str) -> bool:
    """Whether ``filename`` is a built-in workload's (``levers/workloads``): user code for
    source lines, but levers' own when its step fails."""
    path = os.path.abspath(filename) if not filename.startswith("<") else filename
    return path.startswith(_WORKLOADS_DIR)
