"""Freezing a pre-registration, and the rule that lets it grow only by amendments.

The first run against ``FILE`` appends a ``freeze`` event to ``FILE.record.jsonl`` holding the
file's exact text and its SHA-256. Every later run compares the current text with the last
frozen text:

- identical: the run goes ahead;
- the frozen text is a prefix of the current text, the appended part begins (after blank and
  comment lines) with an ``[[amendments]]`` header, and parsing shows that only new
  ``amendments`` entries were added: the amendment is accepted and frozen in turn (a new
  ``freeze`` event);
- anything else is an edit of frozen text: the run is refused, naming the first changed line.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from levers.ab.prereg import Prereg, PreregError, parse_prereg, parse_toml
from levers.ab.record import append_event, read_record, record_path_for
from levers.text_files import read_utf8

UNCHANGED, NEW, AMENDED = "unchanged", "new", "amended"


@dataclass(frozen=True)
class FreezeState:
    sha256: str  # of the current text, which is now frozen
    num_bytes: int
    status: str  # NEW (frozen by this run), UNCHANGED, AMENDED (amendment frozen by this run)
    num_amendments: int
    record_path: str


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _first_changed_line(frozen: str, current: str) -> str:
    old_lines, new_lines = frozen.splitlines(), current.splitlines()
    for number, (old, new) in enumerate(zip(old_lines, new_lines, strict=False), start=1):
        if old != new:
            return f"line {number} was {old.strip()!r}, now {new.strip()!r}"
    if len(new_lines) < len(old_lines):
        return f"frozen text from line {len(new_lines) + 1} on was removed"
    return f"line {len(old_lines)} was changed at its end"


def _first_statement(text: str) -> str:
    for line in text.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            return stripped
    return ""


def check_against_frozen(current: str, frozen: str, where: str) -> str:
    """UNCHANGED or AMENDED; raises PreregError for any other change to the frozen text."""
    if current == frozen:
        return UNCHANGED
    how_to = (
        'A frozen pre-registration only grows: put the frozen text back (the last "freeze" '
        "line of its record holds it) and append an [[amendments]] table saying what changed "
        "and why."
    )
    if not current.startswith(frozen):
        raise PreregError(
            f"{where} was edited after it was frozen ({_first_changed_line(frozen, current)}). "
            + how_to
        )
    appended = current[len(frozen) :]
    if _first_statement(appended) != "[[amendments]]":
        raise PreregError(
            f"{where} grew by text that does not start with an [[amendments]] table "
            f"(first new statement: {_first_statement(appended)!r}). " + how_to
        )
    old, new = parse_toml(frozen, where), parse_toml(current, where)
    old_amendments, new_amendments = old.pop("amendments", []), new.pop("amendments", [])
    if old != new or new_amendments[: len(old_amendments)] != old_amendments:
        raise PreregError(
            f"the text appended to {where} changes frozen tables, not only amendments "
            "(a header such as [design.x] after the amendment reopens a frozen table). " + how_to
        )
    return AMENDED


def freeze(
    path: str | os.PathLike,
    *,
    parse: Callable[[str, str], Any] = parse_prereg,
    init_command: str = "levers ab --init-prereg",
) -> tuple[Prereg, FreezeState]:
    """Validate the pre-registration, check it against its frozen text, freeze what is new.

    ``parse(text, where)`` validates the text (an ab pre-registration by default; a run
    pre-registration passes its own) and returns an object with ``amendments``.
    """
    path = Path(path)
    if not path.is_file():
        raise PreregError(f"no pre-registration at {path}; write one with: {init_command} {path}")
    text = read_utf8(path, PreregError)
    prereg = parse(text, str(path))
    record = record_path_for(path)
    frozen = [e for e in read_record(record) if e.get("event") == "freeze"]
    if not frozen:
        status = NEW
    else:
        last = frozen[-1]
        if sha256_text(last["text"]) != last["sha256"]:
            raise PreregError(
                f"the last freeze event in {record} does not match its own hash; the record was "
                "altered by hand and can no longer vouch for the pre-registration"
            )
        status = check_against_frozen(text, last["text"], str(path))
    state = FreezeState(
        sha256_text(text), len(text.encode("utf-8")), status, len(prereg.amendments), str(record)
    )
    if status != UNCHANGED:
        append_event(
            record,
            {
                "event": "freeze",
                "at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "prereg": path.name,
                "sha256": state.sha256,
                "num_bytes": state.num_bytes,
                "num_amendments": state.num_amendments,
                "text": text,
            },
        )
    return prereg, state
