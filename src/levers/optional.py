"""Optional packages (torchao, Liger Kernel) imported quietly.

torchao's import logs a warning for each of its compiled extensions this machine's CUDA or CPU
cannot load (``Failed to load .../_C_mxfp8...so``), and registers pytree constants that torch
warns about (``register_constant() on Enum subclasses is deprecated``). levers imports torchao
to check whether a lever applies (every audit records every lever's answer), so those lines
would follow every audit on stderr. They are silenced while levers imports the package; what the
package logs afterwards, when it runs, is left alone.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType

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
    with _quiet_loggers():
        transformers = importlib.import_module("transformers")
        importlib.import_module("transformers.modeling_utils")
    return transformers
