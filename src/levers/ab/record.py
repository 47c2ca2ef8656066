"""The append-only record beside a pre-registration, and atomic writes of other outputs.

``FILE.record.jsonl`` holds one JSON object per line, each with ``"event"``: ``"freeze"`` (the
pre-registration's text and hash when it was frozen or amended) or ``"result"`` (one run).
Lines are only ever appended, each with flush + fsync; nothing is rewritten. A record whose
last line is incomplete (an interrupted write) is refused rather than silently extended.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from levers.errors import LeversError
from levers.output.atomic import unwritable

SCHEMA_VERSION = 1


_REPAIR = "Move the damaged line out of the record by hand (keep a copy) and run again"


class RecordError(LeversError):
    """The record file is damaged or cannot be written."""


def record_path_for(prereg_path: str | os.PathLike) -> Path:
    path = Path(prereg_path)
    return path.with_name(path.name + ".record.jsonl")


def to_json(document: dict[str, Any]) -> str:
    # params may hold values JSON lacks (a torch.dtype); their str() is what the user typed
    return json.dumps(document, sort_keys=False, default=str, allow_nan=True)


def read_record(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Every event of a record, in order; [] when the file does not exist yet."""
    path = Path(path)
    if not path.exists():
        return []
    if path.is_dir():
        raise RecordError(f"the record {str(path)!r} is a directory; move it away or give another path")
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        raise RecordError(
            f"the last line of {path} is incomplete (an interrupted write?); inspect the file, "
            "move the damaged line elsewhere by hand, and run again"
        )
    events = []
    for number, raw in enumerate(data.splitlines(), start=1):
        where = f"{path}:{number}"
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise RecordError(f"{where} is not UTF-8 text; the record is damaged. {_REPAIR}") from None
        if not line.strip():
            continue
        try:
            event = json.loads(line)
        except json.JSONDecodeError as exc:
            raise RecordError(f"{where} is not JSON ({exc}); the record is damaged. {_REPAIR}") from None
        if not isinstance(event, dict):
            raise RecordError(
                f"{where} is a JSON {type(event).__name__}, not an event object; the record is "
                f"damaged. {_REPAIR}"
            )
        if event.get("event") == "freeze" and not isinstance(event.get("text"), str):
            raise RecordError(
                f"{where} is a freeze event without the frozen text; the record is damaged. "
                + _REPAIR
            )
        events.append(event)
    return events


def check_record(path: str | os.PathLike) -> None:
    """The record can be extended: undamaged, and its file (or directory) writable."""
    path = Path(path)
    read_record(path)
    target = path if path.exists() else path.parent
    if not os.access(target, os.W_OK):
        raise RecordError(f"cannot write the record {path}: no permission; fix its permissions")


def append_event(path: str | os.PathLike, event: dict[str, Any]) -> None:
    """Append one event as one line, durably."""
    path = Path(path)
    read_record(path)  # refuse to extend a damaged record
    line = to_json({"schema": SCHEMA_VERSION, **event}) + "\n"

    try:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(line)
            handle.flush()
            os.fsync(handle.fileno())
    except OSError as exc:  # a directory at the record's path, a missing or read-only parent
        raise unwritable(path, exc) from None
