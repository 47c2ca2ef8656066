"""The seam to the lever catalogue: find levers by name and apply them to the candidate.

A lever is expected to offer ``apply(workload) -> Workload`` and a ``safety`` of ``"exact"`` or
``"changes-numerics"``; the catalogue (``levers.levers``) is expected to expose ``REGISTRY``, a
mapping from lever name to lever. Levers must act on the workload they are given (swap modules,
wrap its step), not on process-wide state: the baseline runs in the same process, step by step
alternating with the candidate.
"""

from __future__ import annotations

import importlib
from typing import Any, Mapping, Sequence

from levers.errors import LeversError
from levers.workload import Workload

_NO_LEVERS = (
    "no levers are available yet (the lever catalogue levers.levers is empty). Compare two "
    "workloads instead: `levers ab BASELINE CANDIDATE` (two factories), or `levers ab BASELINE "
    "--set-b key=value` (the same factory with other parameters for the candidate)"
)


class LeverNotFound(LeversError):
    """A --lever name that the catalogue does not hold."""


def _registry() -> Mapping[str, Any]:
    catalogue = importlib.import_module("levers.levers")
    catalogue.load_all()  # the lever modules register themselves on import
    registry = getattr(catalogue, "REGISTRY", None)
    if not registry:
        raise LeverNotFound(_NO_LEVERS)
    return registry


def find_levers(names: Sequence[str]) -> list[Any]:
    if not names:
        return []
    registry = _registry()
    unknown = [name for name in names if name not in registry]
    if unknown:
        raise LeverNotFound(
            f"unknown lever(s) {', '.join(unknown)}; available: {', '.join(sorted(registry))} "
            "(levers list shows them all)"
        )
    return [registry[name] for name in names]


def apply_levers(workload: Workload, levers: Sequence[Any]) -> Workload:
    for lever in levers:
        workload = lever.apply(workload)
        if not isinstance(workload, Workload):
            raise TypeError(f"lever {lever!r} returned {type(workload).__name__}, not a Workload")
    return workload


def declared_exactness(levers: Sequence[Any]) -> str | None:
    """ "exact" if every lever declares itself exact, "numerics-changing" if any does not."""
    if not levers:
        return None
    exact = all(getattr(lever, "safety", None) == "exact" for lever in levers)
    return "exact" if exact else "numerics-changing"
