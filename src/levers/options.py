"""What every verb's options record shares: it is given whole or built from keywords, not both.

A verb's record (:class:`levers.audit.options.AuditOptions`,
:class:`levers.memory.options.MemoryOptions`, :class:`levers.tune.options.TuneOptions`) is
built by its ``checked`` classmethod, whose keyword defaults are the values a caller's keywords
have when left unset: they are declared there once, and read here.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, TypeVar

Record = TypeVar("Record")


def options_or_keywords(
    where: str, options: Record | None, checked: Callable[..., Record], given: dict[str, Any]
) -> Record:
    """``options`` when the caller passed the record whole, else ``checked(**given)``.

    ``given`` holds the caller's option keywords under ``checked``'s names; beside a record, each
    must be left at ``checked``'s default for it.

    Raises:
        TypeError: a record and a keyword set otherwise than its default; ``where`` names the
            caller (``"Step.audit"``).
    """
    if options is None:
        return checked(**given)
    unset = inspect.signature(checked).parameters
    if any(value != unset[name].default for name, value in given.items()):
        raise TypeError(f"{where} takes its options as keywords or as options=, not both")
    return options
