"""User files read as text: UTF-8, or a clear error that says what to do (exit 2), never a
``UnicodeDecodeError`` reported as levers' own failure."""

from __future__ import annotations

import os
from pathlib import Path

from levers.errors import LeversError


def read_utf8(
    path: str | os.PathLike, error: type[LeversError] = LeversError, *, bom: bool = False
) -> str:
    """``path``'s text. ``bom``: a leading UTF-8 byte-order mark is dropped (Excel's "CSV
    UTF-8" writes one); else it stays, as it is part of the text (a pre-registration's hash).

    Raises:
        error: the file is not UTF-8, saying where and what to do.
    """
    data = Path(path).read_bytes()
    try:
        return data.decode("utf-8-sig" if bom else "utf-8")
    except UnicodeDecodeError as exc:
        raise error(
            f"{path} is not UTF-8 text ({exc.reason} at byte {exc.start}); save it as UTF-8"
        ) from None
