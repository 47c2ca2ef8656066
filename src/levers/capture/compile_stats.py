"""What torch.compile did before a captured step: frames compiled, recompiles and their guard
failures, graph breaks and where they happened, read from dynamo's own bookkeeping.

Dynamo keeps process-wide records (``torch._dynamo.utils.counters``, ``guard_failures`` per code
object, ``graph_break_reasons``); a :class:`Snapshot` taken before the warm-up lets the capture
keep only what this workload's steps added. The compile of the captured step itself is left
out: the capture's own dispatch mode may make dynamo guard differently, and that is levers', not
the user's. Everything is read defensively: a torch that moved these records yields no stats.
"""

from __future__ import annotations

import linecache
import os
from dataclasses import dataclass, field
from typing import Any

MAX_REASONS = 5  # guard failures kept per recompiled function


@dataclass(frozen=True)
class Snapshot:
    frames_ok: int = 0
    guard_failures: dict[int, int] = field(default_factory=dict)  # id(code) -> failures so far
    num_graph_break_reasons: int = 0
    limit_messages: int = 0


def _records() -> tuple[Any, Any, Any] | None:
    try:
        from torch._dynamo import utils
    except ImportError:
        return None
    try:
        return utils.counters, utils.guard_failures, utils.graph_break_reasons
    except AttributeError:
        return None


def _limit_messages(counters: Any) -> int:
    return sum(n for msg, n in counters["unimplemented"].items() if "recompile limit" in msg)


def _items(failures: Any) -> list[tuple[Any, Any]]:
    """The guard-failure records as a list. Dynamo keys them weakly by code object, and a code
    object freed while the mapping is walked raises ReferenceError: retry, then give up."""
    for _ in range(3):
        try:
            return [(code, list(v)) for code, v in list(failures.items())]
        except (ReferenceError, RuntimeError):  # freed or resized while walked
            continue
    return []


def snapshot() -> Snapshot:
    """Dynamo's counts now. It never raises: it runs inside the user's optimizer hooks."""
    try:
        return _snapshot()
    except Exception:  # noqa: BLE001 - a torch that moved these records yields no stats
        return Snapshot()


def _snapshot() -> Snapshot:
    records = _records()
    if records is None:
        return Snapshot()
    counters, failures, reasons = records
    return Snapshot(
        frames_ok=counters["frames"]["ok"],
        guard_failures={id(code): len(v) for code, v in _items(failures)},
        num_graph_break_reasons=len(reasons),
        limit_messages=_limit_messages(counters),
    )


def _where(code: Any) -> dict[str, Any]:
    file, line = getattr(code, "co_filename", "?"), int(getattr(code, "co_firstlineno", 0))
    return {
        "function": getattr(code, "co_name", "?"),
        "file": os.path.abspath(file),
        "line": line,
        "code": linecache.getline(file, line).strip(),
    }


def since(before: Snapshot) -> dict[str, Any] | None:
    """What dynamo compiled since ``before``; None when it compiled nothing (or when its
    records cannot be read: this never raises into the user's step)."""
    try:
        return _since(before)
    except Exception:  # noqa: BLE001
        return None


def _since(before: Snapshot) -> dict[str, Any] | None:
    records = _records()
    if records is None:
        return None
    counters, failures, reasons = records
    frames = counters["frames"]["ok"] - before.frames_ok
    recompiles = []
    for code, failed in _items(failures):
        new = failed[before.guard_failures.get(id(code), 0):]
        if new:
            recompiles.append(
                {**_where(code), "count": len(new),
                 "reasons": [str(r).strip()[:300] for r in new[:MAX_REASONS]]}
            )
    breaks: dict[tuple[str, str, int], int] = {}
    for reason in list(reasons)[before.num_graph_break_reasons:]:
        if not getattr(reason, "graph_break", False):
            continue
        stack = list(getattr(reason, "user_stack", None) or [])
        frame = stack[-1] if stack else None
        key = (
            str(getattr(reason, "reason", "?")).strip().splitlines()[0][:300],
            os.path.abspath(frame.filename) if frame else "?",
            int(frame.lineno or 0) if frame else 0,
        )
        breaks[key] = breaks.get(key, 0) + 1
    if frames <= 0 and not recompiles and not breaks:
        return None
    return {
        "frames_compiled": max(frames, 0),
        "recompiles": recompiles,
        "graph_breaks": [
            {"reason": r, "file": f, "line": line, "code": linecache.getline(f, line).strip(),
             "count": n}
            for (r, f, line), n in breaks.items()
        ],
        "recompile_limit_hit": _limit_messages(counters) > before.limit_messages,
    }
