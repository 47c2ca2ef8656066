"""A result as one JSON-ready object: what ``--json`` writes and what the record appends."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, Sequence

from levers.ab.expectations import Outcome
from levers.ab.freeze import FreezeState
from levers.ab.runner import AbResult


def result_document(
    result: AbResult,
    environment: dict[str, Any],
    *,
    freeze: FreezeState | None = None,
    outcomes: Sequence[Outcome] = (),
    options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    body = asdict(result)
    return {
        "event": "result",
        "started_at": body.pop("started_at"),
        "options": options,  # the command-line options, as parsed
        "prereg": None
        if freeze is None
        else {
            "sha256": freeze.sha256,
            "num_bytes": freeze.num_bytes,
            "num_amendments": freeze.num_amendments,
            "freeze_status": freeze.status,
        },
        "environment": environment,
        "decision": body.pop("decision"),
        "killed": body.pop("killed"),
        "expectations": [
            {**asdict(o.expectation), "met": o.met, "evidence": o.evidence} for o in outcomes
        ],
        **body,
    }
