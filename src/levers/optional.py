"""Optional packages (torchao, Liger Kernel, timm) imported quietly, or with an error that says
what to do.

torchao's import logs a warning for each of its compiled extensions this machine's CUDA or CPU
cannot load (``Failed to load .../_C_mxfp8...so``), and registers pytree constants that torch
warns about (``register_constant() on Enum subclasses is deprecated``). levers imports torchao
to check whether a lever applies (every audit records every lever's answer), so those lines
would follow every audit on stderr. They are silenced while levers imports the package; what the
package logs afterwards, when it runs, is left alone.

timm imports torchvision, and torchvision loads its compiled operators (``nms``, ``roi_align``...)
when it is imported. A torchvision built for another torch (PyPI's CUDA wheel beside a CPU torch
is the common case) fails there with ``operator torchvision::nms does not exist``, although
timm's models call none of those operators. ``LEVERS_TORCHVISION_WITHOUT_OPS=1`` lets the import
go on without them (torchvision's registrations of those operators are skipped; a call of one of
them still fails, with torch's own error): levers' CPU sweeps and tests set it.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType

import torch

from levers.errors import MissingDependency

# the loggers whose import-time warnings are silenced
_LOGGERS = ("torchao", "torch.utils._pytree")


@contextmanager
def _quiet_loggers() -> Iterator[None]:
    loggers = [logging.getLogger(name) for name in _LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def import_quietly(name: str) -> ModuleType:
    """``importlib.import_module(name)`` with the package's import-time warnings silenced;
    raises ImportError as the import does."""
    with _quiet_loggers():
        return importlib.import_module(name)


def import_transformers() -> ModuleType:
    """``transformers``, with its modeling code loaded quietly: where torchao is installed,
    transformers' quantizers import it when the first model class loads, and its import-time
    warnings would follow a built-in workload's build on stderr. Raises ImportError as the
    import does."""
    transformers = import_past_torchvision("transformers")
    import_past_torchvision("transformers.modeling_utils")
    return transformers


WITHOUT_OPS = "LEVERS_TORCHVISION_WITHOUT_OPS"
# the modules of torchvision that register fake and autograd kernels of its compiled operators
_REGISTRATIONS = ("torchvision._meta_registrations", "torchvision._autograd_registrations")


def _ops_missing(exc: BaseException) -> bool:
    return "torchvision::" in str(exc) or "torchvision/_C" in str(exc)


def torchvision_without_ops() -> None:
    """Under ``LEVERS_TORCHVISION_WITHOUT_OPS=1``, torchvision imported, its compiled operators'
    registrations skipped where they fail, before a package that imports it does."""
    if (os.environ.get(WITHOUT_OPS) != "1" or "torchvision" in sys.modules
            or importlib.util.find_spec("torchvision") is None):
        return
    try:
        importlib.import_module("torchvision")
    except (RuntimeError, OSError) as exc:
        if not _ops_missing(exc):
            raise
        for name in [n for n in sys.modules if n.split(".")[0] == "torchvision"]:
            del sys.modules[name]  # the half-imported package, so that the import runs again
        for name in _REGISTRATIONS:
            sys.modules[name] = types.ModuleType(name)
        importlib.import_module("torchvision")


def import_past_torchvision(name: str) -> ModuleType:
    """``importlib.import_module(name)`` for a package that imports torchvision (timm, and
    transformers where torchvision is installed): a torchvision whose compiled operators do not
    load raises a :class:`MissingDependency` that says what to do, not torch's own error."""
    torchvision_without_ops()
    try:
        return import_quietly(name)
    except (RuntimeError, OSError) as exc:
        if not _ops_missing(exc):
            raise
        raise MissingDependency(
            f"{name.split('.')[0]} imports torchvision, whose compiled operators do not load beside torch "
            f"{torch.__version__} ({str(exc).splitlines()[0]}): torchvision was built for another "
            "torch. Install the torchvision built for this torch (or uninstall torchvision, where "
            f"nothing needs it), or, where only models are built (they call none of those "
            f"operators), set {WITHOUT_OPS}=1"
        ) from exc


def import_timm() -> ModuleType:
    """``import timm``, or a :class:`MissingDependency` that says how to make it import."""
    if importlib.util.find_spec("timm") is None:
        raise MissingDependency(
            "this model needs timm (and torchvision), which is not installed; "
            "install it with: pip install timm"
        )
    return import_past_torchvision("timm")
