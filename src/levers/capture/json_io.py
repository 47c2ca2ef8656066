"""A Capture as a JSON file: written atomically, read back through ``Capture.from_dict``.

The file is ``Capture.to_dict()`` with one extra top-level key, ``"schema"``
(``"levers.capture/<SCHEMA_VERSION>"``), that names the format so a reader can refuse a file it
does not understand. The fields are documented in ``docs/capture-schema.md``.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from levers.capture.records import SCHEMA_VERSION, Capture
from levers.errors import LeversError
from levers.output.atomic import atomic_open

SCHEMA_PREFIX = "levers.capture/"
SCHEMA = f"{SCHEMA_PREFIX}{SCHEMA_VERSION}"


def capture_to_dict(capture: Capture) -> dict[str, Any]:
    """``capture.to_dict()`` with the ``"schema"`` key first."""
    return {"schema": SCHEMA, **capture.to_dict()}


def write_capture(
    capture: Capture, path: str | os.PathLike[str], *, extra: dict[str, Any] | None = None
) -> None:
    """Write ``capture`` to ``path`` as JSON; on any failure the previous file stays as it was.

    ``extra`` adds top-level keys beside the capture's (``levers audit --json`` adds ``"audit"``,
    the findings); :func:`read_capture` ignores them.
    """
    check_writable(path)
    data = {**capture_to_dict(capture), **(extra or {})}
    with atomic_open(path) as f:
        # compact: a large step has 10^5 ops; pretty-print with `python -m json.tool` or jq
        json.dump(_plain(data), f, separators=(",", ":"), allow_nan=False)
        f.write("\n")


def read_capture(path: str | os.PathLike[str]) -> Capture:
    """Load a capture written by :func:`write_capture` (``levers audit --json``)."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise LeversError(
            f"capture file {str(path)!r} does not exist; write one with levers audit --json FILE"
        ) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise LeversError(f"cannot read capture file {str(path)!r}: {exc}") from None
    schema = data.get("schema") if isinstance(data, dict) else None
    if not isinstance(schema, str) or not schema.startswith(SCHEMA_PREFIX):
        raise LeversError(
            f'{str(path)!r} is not a levers capture (its "schema" is {schema!r}, expected '
            f"{SCHEMA!r}); write one with levers audit --json FILE"
        )
    if schema != SCHEMA:
        raise LeversError(
            f"{str(path)!r} has capture schema {schema!r}, but this levers reads {SCHEMA!r}; "
            "re-capture the step with this version of levers"
        )
    try:
        return Capture.from_dict(data)
    except (KeyError, TypeError, ValueError) as exc:
        raise LeversError(f"capture file {str(path)!r} is malformed: {exc!r}") from None


def check_writable(path: str | os.PathLike[str]) -> None:
    """Fail early, before a long capture, if ``path`` cannot be written."""
    target = Path(path)
    directory = target.parent if str(target.parent) else Path(".")
    if not directory.is_dir():
        raise LeversError(
            f"cannot write {str(target)!r}: directory {str(directory)!r} does not exist; "
            "create it first"
        )
    if target.is_dir():
        raise LeversError(f"cannot write {str(target)!r}: it is a directory; give a file name")
    if not os.access(directory, os.W_OK):
        raise LeversError(f"cannot write {str(target)!r}: directory is not writable")


def _plain(value: Any) -> Any:
    """Make ``value`` strict JSON: non-finite floats become strings, unknown objects their str().

    Call-record arguments are free-form (a dtype, an enum, inf for a mask fill value); the
    schema states that such values arrive as strings.
    """
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # "inf", "-inf", "nan"
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)
