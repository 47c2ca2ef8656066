"""The seam to the lever catalogue: find levers by name and apply them to the candidate.

Levers come from :data:`levers.levers.REGISTRY` (:func:`levers.levers.load_all`). A lever acts
on the workload it is given (swaps modules, wraps its step), never on process-wide state: the
baseline runs in the same process, step by step alternating with the candidate. A lever on the
factory parameters (``raise-batch``) chooses the candidate's parameters before it is built.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any, Sequence

from levers.levers import load_all
from levers.levers.handle import apply_chosen, find_specs
# a --lever name the catalogue does not hold, or options it refuses (a lever that exists but has
# nothing to change on the workload raises NotApplicable in apply_levers instead)
from levers.levers.lever import LeverNotFound, NotApplicable, target_of
from levers.workload import Workload
from levers.vocab import CHANGES_NUMERICS, EXACT


@dataclass(frozen=True)
class ChosenLever:
    """A lever named on the command line, with the options written after its id
    (``ac-budget:budget=22GiB``); reads as the lever itself otherwise."""

    lever: Any
    options: dict[str, str] = field(default_factory=dict)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.lever, name)


def find_levers(names: Sequence[str]) -> list[ChosenLever]:
    """The levers ``names`` ask for (ids, comma lists, ``id:key=value`` specs), in order."""
    if not names:
        return []
    split = [part.strip() for name in names for part in str(name).split(",") if part.strip()]
    try:
        return [ChosenLever(lever, options) for lever, options in find_specs(split)]
    except ValueError as exc:
        raise LeverNotFound(str(exc)) from None


def predicting_own_workload(levers: Sequence[ChosenLever], spec: str) -> list[ChosenLever]:
    """``levers`` with ``workload=spec`` given to each lever that predicts a workload's memory
    (it takes a ``workload`` option: ac-budget) and was told neither which (``workload=``) nor
    what to plan from (``inputs=``): an A/B's lever predicts the side it is applied to, built
    from ``spec`` with that side's own parameters."""
    out = []
    for chosen in levers:
        takes = "workload" in getattr(chosen.lever, "options", ())
        if takes and not {"workload", "inputs"} & set(chosen.options):
            chosen = ChosenLever(chosen.lever, {**chosen.options, "workload": spec})
        out.append(chosen)
    return out


def choose_params(
    spec: Any,
    params: dict[str, Any],
    levers: Sequence[Any],
    beside: tuple[Any, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The candidate's parameters after the levers that choose them; says what each chose.
    ``beside``: the baseline's (spec, parameters), which the A/B holds on the same device while
    the candidate runs (raise-batch leaves room for it)."""
    others = [lever.id for lever in levers if lever.choose_params is None]
    context: dict[str, Any] = {"levers": others}
    if beside is not None:
        context["beside"] = beside
    for lever in levers:
        if lever.choose_params is None:
            continue
        try:
            params, said = lever.choose_params(spec, dict(params), {**lever.options, **context})
        except ValueError as exc:
            raise LeverNotFound(f"lever {lever.id}: {exc}") from None
        print(said, file=sys.stderr)
    return params


def apply_levers(workload: Workload, levers: Sequence[ChosenLever]) -> Workload:
    model_levers = [(c.lever, c.options) for c in levers if c.choose_params is None]
    if not model_levers:
        return workload
    try:
        apply_chosen(workload, model_levers)
    except NotApplicable as exc:
        raise NotApplicable(
            f"{exc} (to the candidate {workload.name}); {applicable_text(workload)}"
        ) from None
    return workload


def applicable_levers(workload: Workload) -> list[str]:
    """Ids of the catalogue's model levers that would apply to ``workload`` as it is built."""
    ids = []
    for lever in load_all().values():
        if lever.choose_params is not None or lever.options:
            continue  # it chooses parameters, or needs options to say whether it applies
        try:
            reason = lever.applies(target_of(workload))
        except Exception:  # noqa: BLE001 - a check that cannot run here does not list the lever
            continue
        if reason is None:
            ids.append(lever.id)
    return ids


def applicable_text(workload: Workload) -> str:
    ids = applicable_levers(workload)
    if not ids:
        return "no lever of the catalogue applies to it as built (levers list shows them all)"
    return f"levers that apply to it: {', '.join(ids)}"


def declared_parity_floor(levers: Sequence[Any]) -> tuple[float, str] | None:
    """The largest one-step parity floor the levers declare, with the lever that declares it
    (float8 rounds to fewer bits than bf16), or None."""
    floors = [
        (lever.parity_floor, lever.id)
        for lever in levers
        if getattr(lever, "parity_floor", None) is not None
    ]
    return max(floors) if floors else None


def declared_exactness(levers: Sequence[Any]) -> str | None:
    """ "exact" if every lever declares itself exact, "changes-numerics" if any does not."""
    if not levers:
        return None
    exact = all(getattr(lever, "safety", None) == EXACT for lever in levers)
    return EXACT if exact else CHANGES_NUMERICS
