"""The time budget of ``levers tune``: ``--budget 10m``, ``90s``, ``1h30m`` or plain seconds.

The project has no other duration parser (sizes are read by :mod:`levers.hardware`'s budgets);
this one reads the units a user types on a command line.
"""

from __future__ import annotations

import re

# the budget of a search when none is given (levers tune --budget, Step.tune(budget=))
DEFAULT_BUDGET = "10m"

_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")


def parse_duration_s(text: str | float | int) -> float:
    """Seconds in ``text`` (``"10m"``, ``"1h30m"``, ``"45s"``, ``"600"``).

    Raises:
        ValueError: not a positive duration, with the forms that read.
    """
    usage = "write the budget as 10m, 90s, 1h30m or a number of seconds"
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        seconds = float(text)
    else:
        compact = str(text).strip().lower().replace(" ", "")
        try:
            seconds = float(compact)
        except ValueError:
            parts = _PART.findall(compact)
            if not parts or "".join(n + u for n, u in parts) != compact:
                raise ValueError(f"cannot read the duration {text!r}; {usage}") from None
            seconds = sum(float(n) * _UNIT_S[u] for n, u in parts)
    if not seconds > 0:
        raise ValueError(f"the budget must be positive, got {text!r}; {usage}")
    return seconds


def format_duration(seconds: float) -> str:
    """``4m12s``, ``38s``: how long is left, for the progress line."""
    seconds = max(int(round(seconds)), 0)
    minutes, rest = divmod(seconds, 60)
    if minutes >= 60:
        hours, minutes = divmod(minutes, 60)
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{rest:02d}s" if minutes else f"{rest}s"
