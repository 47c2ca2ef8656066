"""Package attributes imported on first read, so that importing a package stays light.

``levers --help`` imports every verb's parser module, and with it the packages above them
(``levers.audit``, ``levers.capture``, ...). A package whose ``__init__`` imported its modules
would import torch there; instead it names where each attribute lives and this module's
:func:`lazy_attributes` loads it on first use (PEP 562).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_attributes(
    package: str, namespace: dict[str, Any], where: dict[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``: ``where`` maps a name to its module."""

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value  # later reads skip this function
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(where))

    return __getattr__, __dir__
