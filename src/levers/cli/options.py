"""Options shared by several verbs, each declared once here."""

from __future__ import annotations

import argparse
from typing import Any


def count(text: str) -> int:
    """A whole number >= 0 (steps, resamples): the ``type=`` of a count option."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {value}")
    return value


def add_set_argument(
    parser: Any, flag: str = "--set", *, dest: str = "set_items", help: str | None = None
) -> None:
    """Add a ``--set KEY=VALUE ...`` option (read with :func:`parse_set`) to an argparse parser."""
    parser.add_argument(
        flag,
        dest=dest,
        nargs="+",
        action="extend",
        default=[],
        metavar="KEY=VALUE",
        help=help
        or "a factory parameter; values are Python literals (4, 1e-3, True) or plain strings (1b)",
    )
