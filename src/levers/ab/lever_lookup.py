"""The seam to the lever catalogue: find levers by name and apply them to the candidate.

Levers come from :data:`levers.levers.REGISTRY` (:func:`levers.levers.load_all`). A lever acts
on the workload it is given (swaps modules, wraps its step), never on process-wide state: the
baseline runs in the same process, step by step alternating with the candidate. A lever on the
factory parameters (``raise-batch``) chooses the candidate's parameters before it is built.
"""

from __future__ import annotations

import sys
from typing import Any, Sequence

from levers.errors import LeversError
from levers.workload import Workload


class LeverNotFound(LeversError):
    """A --lever name that the catalogue does not hold, or one that does not apply."""


def _registry() -> dict[str, Any]:
    from levers.levers import load_all

    return load_all()


def find_levers(names: Sequence[str]) -> list[Any]:
    if not names:
        return []
    registry = _registry()
    split = [part.strip() for name in names for part in str(name).split(",") if part.strip()]
    unknown = [name for name in split if name not in registry]
    if unknown:
        raise LeverNotFound(
            f"unknown lever(s) {', '.join(unknown)}; available: {', '.join(sorted(registry))} "
            "(levers list shows them all)"
        )
    return [registry[name] for name in split]


def choose_params(spec: Any, params: dict[str, Any], levers: Sequence[Any]) -> dict[str, Any]:
    """The candidate's parameters after the levers that choose them; says what each chose."""
    others = [lever.id for lever in levers if lever.choose_params is None]
    for lever in levers:
        if lever.choose_params is None:
            continue
        try:
            params, said = lever.choose_params(spec, dict(params), {"levers": others})
        except ValueError as exc:
            raise LeverNotFound(f"lever {lever.id}: {exc}") from None
        print(said, file=sys.stderr)
    return params


def apply_levers(workload: Workload, levers: Sequence[Any]) -> Workload:
    from levers.levers.handle import apply as apply_handle
    from levers.levers.lever import NotApplicable

    model_levers = [lever.id for lever in levers if lever.choose_params is None]
    if not model_levers:
        return workload
    try:
        apply_handle(workload, model_levers)
    except NotApplicable as exc:
        raise LeverNotFound(f"{exc} (to the candidate {workload.name})") from None
    return workload


def declared_exactness(levers: Sequence[Any]) -> str | None:
    """ "exact" if every lever declares itself exact, "numerics-changing" if any does not."""
    if not levers:
        return None
    exact = all(getattr(lever, "safety", None) == "exact" for lever in levers)
    return "exact" if exact else "numerics-changing"
