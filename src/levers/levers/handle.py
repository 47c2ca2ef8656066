"""``levers.apply``: levers applied to a model (or a workload) inside a user's own script.

    import levers

    with levers.apply(model, "rms-norm-fused,fused-optimizer", optimizer=opt):
        train(model, opt)          # levers on

    handle = levers.apply(model, ["compile-blocks"], backend="inductor")
    ...
    handle.undo()                  # the model exactly as it was

Levers are applied in the order given (a lever that plans for another's result, ``ac-budget``
for ``compile-blocks``, after it: :func:`in_order`). One that does not apply raises
:class:`levers.levers.lever.NotApplicable` with its reason after undoing those applied before it
(``skip_inapplicable=True`` skips it instead, and ``handle.skipped`` says why). Levers that wrap
the training step (autocast, the windowed peak metric) need ``step=``; the wrapped step is
``handle.step``.

The data levers (packing, padding-free, pad-to-multiple) change batches: a workload's (its step
draws them through ``step.batches``), a Hugging Face Trainer's (``levers.apply(trainer,
"packing")``, before ``trainer.train()``: its collator is wrapped, and the undo puts it back) or
a DataLoader's (``levers.apply(model, "packing", data=loader)``: its ``collate_fn`` is wrapped).
"""

from __future__ import annotations

import difflib
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch

from levers.batches import collator_attribute, wrap_collator
from levers.errors import LeversError
from levers.levers import load_all
from levers.levers.lever import (
    Lever,
    LeverNotFound,
    NotApplicable,
    Target,
    Undo,
    check_options,
    parse_lever_spec,
)
from levers.workload import Workload


def parse_ids(ids: str | Iterable[str]) -> list[str]:
    if isinstance(ids, str):
        ids = ids.split(",")
    names = [name.strip() for name in ids if name and name.strip()]
    if not names:
        raise LeverNotFound("name at least one lever (levers list shows them)")
    return names


def find(ids: str | Iterable[str]) -> list[Lever]:
    return [lever for lever, _ in find_specs(ids)]


def find_specs(ids: str | Iterable[str]) -> list[tuple[Lever, dict[str, str]]]:
    """Each lever named in ``ids`` with the options its spec gives (``ac-budget:budget=22GiB``);
    an option the lever does not accept is refused here, before anything is applied."""
    registry = load_all()
    try:
        specs = [parse_lever_spec(name) for name in parse_ids(ids)]
        unknown = [name for name, _ in specs if name not in registry]
        if unknown:
            raise LeverNotFound(
                f"unknown lever(s) {', '.join(unknown)}{_close_to(unknown, registry)}; available: "
                f"{', '.join(sorted(registry))} (levers list shows them)"
            )
        for name, options in specs:
            check_options(registry[name], options)
    except LeversError:
        raise
    except ValueError as exc:  # a malformed spec, or options the lever refuses
        raise LeverNotFound(str(exc)) from None
    return [(registry[name], options) for name, options in specs]


def _close_to(unknown: list[str], registry: Mapping[str, Any]) -> str:
    """"; did you mean ..." for an unknown id that is one typo away from a lever's."""
    close = [
        match for name in unknown for match in difflib.get_close_matches(name, list(registry), n=1)
    ]
    return f" (did you mean {', '.join(close)}?)" if close else ""


@dataclass
class Handle:
    """Levers applied to one target; ``undo()`` (or leaving the ``with`` block) reverts them."""

    target: Target
    workload: Workload | None = None
    applied: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    # what each applied lever's patch returned, by id: its undo, which may carry what it did
    # (ac-budget's plan)
    patches: dict[str, Undo] = field(default_factory=dict, repr=False)
    _undos: list[Undo] = field(default_factory=list, repr=False)

    @property
    def model(self) -> torch.nn.Module:
        return self.target.model

    @property
    def step(self) -> Callable[[], Any] | None:
        return self.target.step

    def undo(self) -> None:
        while self._undos:
            self._undos.pop()()
        self.applied.clear()
        self.patches.clear()
        if self.workload is not None:
            self.workload.step = self.target.step

    def __enter__(self) -> Handle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.undo()


def _apply(
    handle: Handle,
    levers: list[tuple[Lever, dict[str, Any]]],
    skip_inapplicable: bool,
    quiet: bool,
) -> Handle:
    """Apply each (lever, its own options) in order; a lever sees the shared options given to
    :func:`apply` overlaid with its own."""
    shared = dict(handle.target.options)
    earlier = list(handle.target.before)
    for lever, own in in_order(levers):
        handle.target.options = {**shared, **own}
        handle.target.before = tuple(earlier)
        try:
            reason = lever.applies(handle.target)
            if reason is not None:
                if skip_inapplicable:
                    handle.skipped[lever.id] = reason
                    if not quiet:
                        warnings.warn(f"lever {lever.id} skipped: {reason}", stacklevel=3)
                    continue
                handle.undo()
                raise NotApplicable(f"lever {lever.id} does not apply: {reason}")
            before = handle.target.step
            try:
                undo_patch = lever.patch(handle.target)
            except BaseException:
                handle.undo()  # those applied before it: all or none
                raise
        finally:
            handle.target.options = shared

        def undo(undo_patch: Undo = undo_patch, before: Any = before) -> None:
            undo_patch()
            handle.target.step = before

        handle._undos.append(undo)
        handle.applied.append(lever.id)
        handle.patches[lever.id] = undo_patch
        earlier.append((lever.id, {**shared, **own}))
    if handle.workload is not None:
        handle.workload.step = handle.target.step
    return handle


def in_order(levers: list[tuple[Lever, Any]]) -> list[tuple[Lever, Any]]:
    """``levers`` in the order given, except that a lever that names others in ``after`` is
    moved to just after the last of them (``ac-budget,compile-blocks`` applies compile-blocks
    first)."""
    ordered = list(levers)
    for item in list(ordered):
        position = next(i for i, other in enumerate(ordered) if other is item)
        later = [
            i for i, (other, _) in enumerate(ordered) if other.id in item[0].after and i > position
        ]
        if later:
            ordered.insert(max(later) + 1, item)
            ordered.pop(position)
    return ordered


def apply_chosen(
    workload: Workload,
    levers: list[tuple[Lever, dict[str, Any]]],
    *,
    skip_inapplicable: bool = False,
) -> Handle:
    """Apply levers already found (with their own options) to ``workload``; the form
    ``levers ab --lever`` uses. Raises :class:`NotApplicable` as :func:`apply` does, unless
    ``skip_inapplicable`` (then quietly skipped, ``handle.skipped`` says why)."""
    target = Target(
        model=workload.model,
        optimizer=workload.optimizer,
        step=workload.step,
        params=dict(workload.params),
    )
    return _apply(Handle(target, workload), levers, skip_inapplicable, quiet=skip_inapplicable)


def apply(
    model_or_workload: torch.nn.Module | Workload,
    ids: str | Iterable[str],
    *,
    optimizer: torch.optim.Optimizer | None = None,
    step: Callable[[], Any] | None = None,
    data: Any = None,
    skip_inapplicable: bool = False,
    **options: Any,
) -> Handle:
    """Apply the levers ``ids`` ("a,b", a list, ``id:key=value`` specs) in place; returns the
    :class:`Handle`. ``model_or_workload`` may be a Hugging Face Trainer (its model, optimizer
    and collator); ``data`` a DataLoader whose batches the data levers change."""
    levers = find_specs(ids)
    if not isinstance(model_or_workload, (torch.nn.Module, Workload)) and (
        collator_attribute(model_or_workload) == "data_collator"
    ):
        trainer = model_or_workload
        data = trainer if data is None else data
        optimizer = optimizer or getattr(trainer, "optimizer", None)
        model_or_workload = trainer.model
    if data is not None:
        if isinstance(model_or_workload, Workload):
            raise TypeError("a workload draws its own batches: data= is for a model's DataLoader")
        return _apply_with_collator(
            model_or_workload, data, levers, optimizer, step, skip_inapplicable, options
        )
    if isinstance(model_or_workload, Workload):
        workload = model_or_workload
        target = Target(
            model=workload.model,
            optimizer=optimizer or workload.optimizer,
            step=step or workload.step,
            params=dict(workload.params),
            options=dict(options),
        )
        return _apply(Handle(target, workload), levers, skip_inapplicable, quiet=False)
    if not isinstance(model_or_workload, torch.nn.Module):
        raise TypeError(
            f"levers.apply takes an nn.Module or a levers.Workload, got "
            f"{type(model_or_workload).__name__}"
        )
    target = Target(model=model_or_workload, optimizer=optimizer, step=step, options=dict(options))
    return _apply(Handle(target), levers, skip_inapplicable, quiet=False)


def _apply_with_collator(
    model: Any,
    host: Any,
    levers: list[tuple[Lever, dict[str, Any]]],
    optimizer: torch.optim.Optimizer | None,
    step: Callable[[], Any] | None,
    skip_inapplicable: bool,
    options: dict[str, Any],
) -> Handle:
    if not isinstance(model, torch.nn.Module):
        raise TypeError(
            f"levers.apply with a collator needs the model: got {type(model).__name__}"
        )
    found, undo_collator = wrap_collator(host)
    target = Target(
        model=model, optimizer=optimizer, step=step, options=dict(options), batches=found
    )
    handle = Handle(target)
    handle._undos.append(undo_collator)  # undone last, after every lever
    return _apply(handle, levers, skip_inapplicable, quiet=False)


def replay(workload: Workload, stack: Iterable[tuple[str, dict[str, Any]]]) -> Handle:
    """Apply ``stack`` (lever ids with the options they were applied with, as
    :attr:`Target.before` records them) to ``workload``, in order, skipping those that do not
    apply: the stack of a run, on the step a prediction builds."""
    registry = load_all()
    levers = [(registry[lever_id], dict(options)) for lever_id, options in stack]
    return apply_chosen(workload, levers, skip_inapplicable=True)


def apply_to_workload(
    workload: Workload, ids: Iterable[str], *, quiet: bool = False, **options: Any
) -> Handle:
    """The workload-level form that ``levers ab`` and raise-batch's prediction use: levers that
    do not apply are skipped (``handle.skipped`` says why)."""
    ids = list(ids)
    if not ids:
        return Handle(Target(model=workload.model, step=workload.step), workload)
    target = Target(
        model=workload.model,
        optimizer=workload.optimizer,
        step=workload.step,
        params=dict(workload.params),
        options=dict(options),
    )
    levers = [(lever, own) for lever, own in find_specs(ids) if lever.choose_params is None]
    return _apply(Handle(target, workload), levers, skip_inapplicable=True, quiet=quiet)
