"""A lever option's value read from a spec's text (``liger-kernels:rope=false``) into the type
the lever uses, or refused with what is accepted: each lever's ``check`` calls these when the
lever is named, before anything is built, and its patch reads the same values.

On the command line every option is text, and text is truthy: ``rope="false"`` would turn a
kernel on. A value given from Python as the type itself (``rope=False``) is taken as it is.
"""

from __future__ import annotations

import math
from typing import Any

_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")
_NONE = ("none", "auto")


def flag(lever: str, key: str, value: Any, *, allow_none: bool = False) -> bool | None:
    """``value`` as a boolean: True/False, or their text (true/false, yes/no, on/off, 1/0);
    where ``allow_none``, None or "none"/"auto" as None."""
    if value is None and allow_none or isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    if allow_none and text in _NONE:
        return None
    accepted = "true or false" + (" (or none)" if allow_none else "")
    raise ValueError(f"{lever}: {key}={value!r} is not {accepted}")


def count(lever: str, key: str, value: Any) -> int:
    """``value`` as a whole number of at least 1 (``4096``, ``"4096"``, ``"4e3"``)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if isinstance(value, bool) or not math.isfinite(number) or number < 1 or number != int(number):
        raise ValueError(f"{lever}: {key}={value!r} is not a whole number of at least 1")
    return int(number)


def choice(lever: str, key: str, value: Any, accepted: tuple[str, ...]) -> str:
    """``value`` as one of ``accepted``."""
    if str(value) not in accepted:
        raise ValueError(f"{lever}: {key}={value!r} is not one of {', '.join(accepted)}")
    return str(value)
