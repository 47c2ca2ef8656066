"""Which levers apply to a captured model, recorded in its capture.

The audit's rules are pure functions of a capture and never see the model, so a finding names
the levers that fix its pattern in general (sdpa-attention for eager attention). Whether each of
them can act on *this* model (attention written out by hand in the user's own code, a loss
outside Hugging Face's) is only known from the model itself. So the places that make a capture
from a live model (:meth:`levers.Step.capture`, :func:`levers.capture_step`, the script runner)
record every lever's ``applies`` answer in ``capture.settings["levers"]`` (id -> None where it
applies, else its reason), and the recommended stack (:mod:`levers.audit.recommend`) holds only
levers that apply: the ``levers ab`` command and the ``levers.apply`` line it prints then run.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

from levers.capture.records import Capture
from levers.levers import load_all
from levers.levers.lever import target_of
from levers.workload import Workload

SETTING = "levers"


def applicability(workload: Workload) -> dict[str, str | None]:
    """Every lever's answer on ``workload``: None where it applies, else why not."""
    answers: dict[str, str | None] = {}
    with warnings.catch_warnings():  # a check that imports an optional package may warn
        warnings.simplefilter("ignore")
        for lever_id, lever in sorted(load_all().items()):
            try:
                # a lever that also needs options (ac-budget's budget) is asked of the model
                check = lever.applies_to_model or lever.applies
                answers[lever_id] = check(target_of(workload))
            except Exception as exc:  # noqa: BLE001 - a check that fails says the lever cannot act
                answers[lever_id] = f"its applies check raised {type(exc).__name__}: {exc}"
    return answers


def with_applicability(capture: Capture, workload: Workload) -> Capture:
    """``capture`` with every lever's answer on ``workload`` in its settings."""
    settings = {**capture.settings, SETTING: applicability(workload)}
    return dataclasses.replace(capture, settings=settings)


def recorded(capture: Capture) -> dict[str, str | None] | None:
    """The answers a capture recorded, or None (a capture made before they were, or read back
    from a file written then)."""
    answers: Any = capture.settings.get(SETTING)
    return dict(answers) if isinstance(answers, dict) else None
