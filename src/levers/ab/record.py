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

SCHEMA_VERSION = 1


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
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        raise RecordError(
            f"the last line of {path} is incomplete (an interrupted write?); inspect the file, "
            "move the damaged line elsewhere by hand, and run again"
        )
    events = []
    for number, line in enumerate(data.decode("utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise RecordError(
                f"{path}:{number} is not JSON ({exc}); the record is damaged"
            ) from None
    return events


def append_event(path: str | os.PathLike, event: dict[str, Any]) -> None:
    """Append one event as one line, durably."""
    path = Path(path)
    read_record(path)  # refuse to extend a damaged record
    line = to_json({"schema": SCHEMA_VERSION, **event}) + "\n"
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(line)
        handle.flush()
        os.fsync(handle.fileno())
