"""The lever contract: what every lever in the catalogue offers.

A lever is one transformation of a training step that a finding recommends: swap a module's
forward, wrap a region in checkpointing, set an optimizer flag, wrap the step in autocast. Each
lever lives in its own file under :mod:`levers.levers` and registers one :class:`Lever` there.

- ``applies(target)`` says why not (a sentence) when the lever has nothing to change on this
  model, optimizer and step, and ``None`` when it applies.
- ``patch(target)`` changes the target in place and returns the undo: a function with no
  arguments that puts every changed attribute back. A lever never changes process-wide state
  (a torch global, a backend flag) without putting it back in its undo, and acts only on the
  model and optimizer it is given: the A/B runner alternates baseline and candidate in one process.
- ``safety`` is :data:`levers.vocab.EXACT` (bitwise the same losses and gradients in fp32 on a
  CPU) or :data:`levers.vocab.CHANGES_NUMERICS`, with ``tolerance`` the relative tolerance its
  parity test checked.

``apply(workload, lever)`` is the workload-level form used by ``levers ab --lever``: the same
workload object, changed, and its undo.

A lever may take options (``ac-budget`` takes its memory budget). It names the ones it accepts
in ``options``; they reach ``patch`` as ``target.options`` (strings from the command line, or any
value from Python), passed as ``apply(workload, lever, {"budget": "20GiB"})`` or written
``ac-budget:budget=20GiB:workload=hf`` on the command line (:func:`parse_lever_spec`). The undo ``patch``
returns may carry data about what it did (a handle); ``apply``'s undo keeps it as ``.handle``.

A lever that acts on the workload's factory parameters rather than on a built model
(``raise-batch``) sets ``choose_params``: given the factory spec and its parameters it returns the
parameters to build the candidate with and a sentence saying what it chose. ``levers ab --lever``
calls it before building the candidate; ``patch`` is then never called on a built model.

A lever that changes nothing the step computes, only what is observed of it (a metric such as
``windowed-peak-metric``, a guard), sets ``observes_only``: ``levers tune`` leaves it out of its
search for speed, where an A/B could only find noise in it.

A lever that must see what another did (``ac-budget`` plans for the blocks as ``compile-blocks``
compiled them) names it in ``after``: a stack of levers is applied in the order given, except
that such a lever is moved after the levers it names (:func:`levers.levers.handle.in_order`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:  # only named in annotations: `levers list` reads the catalogue without torch
    import torch

from levers.errors import LeversError
from levers.vocab import CHANGES_NUMERICS, EXACT, FIX_SAFETIES
from levers.workload import Workload

Undo = Callable[[], None]
# (factory spec, its parameters, lever options) -> (the parameters to build with, what it chose)
ChooseParams = Callable[[Any, dict[str, Any], dict[str, Any]], tuple[dict[str, Any], str]]


@dataclass
class Target:
    """What a lever may change: the model, its optimizer and the step that trains them.

    ``step`` is the workload's step function; a lever that wraps the step (autocast, say) sets a
    new one here, and :func:`apply` copies it back onto the workload.
    """

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer | None = None
    step: Callable[[], Any] | None = None
    params: dict[str, Any] = field(default_factory=dict)  # the workload's factory parameters
    options: dict[str, Any] = field(default_factory=dict)  # the lever's options, by name
    # the batches of a Trainer's or DataLoader's collator (levers.apply(trainer, ...)); a
    # workload's step carries its own (levers.batches.batches_of)
    batches: Any = None
    # the levers applied before this one in the same call, each (id, its options), in order: a
    # lever that predicts the step (ac-budget) replays them on the step it predicts
    before: tuple[tuple[str, dict[str, Any]], ...] = ()


class LeverNotFound(LeversError, ValueError):
    """A lever name the catalogue does not hold, or options its lever refuses: a user error
    with exit 2 (a ``ValueError`` too, as every refusal of a lever's input is)."""


class NotApplicable(LeversError, ValueError):
    """A lever that exists, asked to apply where it has nothing to change; the message says why.

    Not a lookup failure (the lever is in the catalogue): a user error with exit 2. A
    ``ValueError`` too, as every refusal of a lever's input is.
    """


@dataclass(frozen=True)
class Lever:
    id: str  # kebab-case, stable: "rms-norm-fused"
    title: str  # what it does, as a fix title: "Use F.rms_norm for the RMSNorm modules"
    safety: str  # EXACT or CHANGES_NUMERICS
    fixes: tuple[str, ...]  # finding codes it fixes ("NORM001",)
    applies: Callable[[Target], str | None]  # None, or why it does not apply
    patch: Callable[[Target], Undo]  # changes the target in place, returns the undo
    tolerance: float | None = None  # for CHANGES_NUMERICS: the relative tolerance checked
    needs_gpu: bool = False  # its speed-up exists only on a GPU (it still runs on a CPU)
    # it changes nothing the step computes, only what is observed of it (a metric, a guard):
    # never a speed candidate for levers tune, whose A/Bs could only find noise in it
    observes_only: bool = False
    runs_on_cpu: bool = True  # False: it refuses to run without a CUDA device (raise-batch)
    options: tuple[str, ...] = ()  # the option names it accepts ("budget",)
    choose_params: ChooseParams | None = None  # set by a lever on the factory parameters
    known_problems: str = ""  # combinations that fail, shapes where it does not help
    # checks the values of its options (raises ValueError), when the spec is read: before any
    # workload is built or predicted
    check: Callable[[dict[str, Any]], None] | None = None
    # it changes the step's batches (packing), not the model: it needs a step that exposes them
    # (levers.batches.Batches), a Trainer's collator or a DataLoader's
    acts_on_batches: bool = False
    # levers this one is applied after when a stack names both, in either order (ac-budget
    # plans for compiled blocks, so it follows compile-blocks)
    after: tuple[str, ...] = ()
    # levers this one pays only on top of (float8's scaling casts fuse only under compile): the
    # audit measures it as an increment over them, not alone against the baseline
    measured_on: tuple[str, ...] = ()
    # the least relative tolerance of the A/B's one-step parity checks when the candidate runs
    # this lever (None: the table's, for the step's precision): a lever that rounds to fewer bits
    # than bf16 (float8) drifts further in one step than bf16's tolerance allows, and its proof
    # is the quality read
    parity_floor: float | None = None
    # why it would lose for speed on this target, where its measured regime says so (the fused
    # loss's chunked kernel on a GPU: a memory lever there); None: no such regime. Read by
    # levers tune, which leaves it out of a speed search with the reason
    slower_here: Callable[[Target], str | None] | None = None
    # its applies answer depends on the device the model is on (float8 needs a GPU of compute
    # capability 8.9): a CPU capture's answer says nothing of the GPU run
    device_bound: bool = False
    # the part of ``applies`` about the model alone, for a lever that also needs options to act
    # (ac-budget needs a budget): what the audit asks of a captured model
    applies_to_model: Callable[[Target], str | None] | None = None
    # a float64 run of the model keeps this lever's change (channels-last's layout): where the
    # parity gate fails on a step that amplifies rounding, ab runs the candidate in float64 to
    # tell its math from its rounding (levers.ab.rounding). Not compile (the float64 run is
    # eager) nor autocast (it leaves float64 alone)
    float64_faithful: bool = False

    def __post_init__(self) -> None:
        if self.safety not in FIX_SAFETIES:
            raise ValueError(f"lever {self.id}: safety must be one of {FIX_SAFETIES}")
        # a lever on the factory parameters changes the step itself (another batch): no tolerance
        numerics = self.safety == CHANGES_NUMERICS
        if numerics and self.tolerance is None and self.choose_params is None:
            raise ValueError(f"lever {self.id}: a numerics-changing lever states its tolerance")
        if self.safety == EXACT and self.tolerance is not None:
            raise ValueError(f"lever {self.id}: an exact lever has no tolerance")
        if self.safety == EXACT and self.parity_floor is not None:
            raise ValueError(f"lever {self.id}: an exact lever is held to the baseline directly")
        if self.id in self.measured_on:
            raise ValueError(f"lever {self.id}: measured_on names the lever itself")


def target_of(workload: Workload, options: dict[str, Any] | None = None) -> Target:
    return Target(
        model=workload.model,
        optimizer=workload.optimizer,
        step=workload.step,
        params=dict(workload.params),
        options=dict(options or {}),
    )


def lever_id_of(spec: str) -> str:
    """The lever id of a lever spec: ``"compile-model:mode=default"`` -> ``"compile-model"``
    (the syntax is :func:`parse_lever_spec`'s, which also reads and checks the options)."""
    return spec.split(":", 1)[0].strip()


def parse_lever_spec(text: str) -> tuple[str, dict[str, str]]:
    """``"ac-budget:budget=20GiB:workload=hf"`` -> ``("ac-budget", {"budget": "20GiB",
    "workload": "hf"})``. Options are separated by ``:``, so that ``,`` still separates levers in
    ``--lever a,b``."""
    lever_id, *items = text.split(":")
    options: dict[str, str] = {}
    for item in filter(None, items):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(
                f"lever option {item!r} in {text!r} is not KEY=VALUE; write e.g. "
                "ac-budget:budget=20GiB:workload=hf"
            )
        options[key.strip()] = value.strip()
    return lever_id_of(lever_id), options


def check_options(lever: Lever, options: dict[str, Any]) -> None:
    unknown = sorted(set(options) - set(lever.options))
    if unknown:
        accepted = ", ".join(lever.options) if lever.options else "none"
        raise ValueError(
            f"lever {lever.id} has no option(s) {', '.join(unknown)}; it accepts: {accepted}"
        )
    if lever.check is not None:
        lever.check(options)


def apply(
    workload: Workload, lever: Lever, options: dict[str, Any] | None = None
) -> tuple[Workload, Undo]:
    """Apply ``lever`` to ``workload`` in place; returns the workload and the undo.

    Raises :class:`NotApplicable` with the lever's reason when it does not apply, and
    ``ValueError`` for an option the lever does not accept.
    """
    check_options(lever, dict(options or {}))
    target = target_of(workload, options)
    reason = lever.applies(target)
    if reason is not None:
        raise NotApplicable(f"lever {lever.id} does not apply: {reason}")
    original_step = workload.step
    undo_patch = lever.patch(target)
    if target.step is not None and target.step is not original_step:
        workload.step = target.step

    def undo() -> None:
        undo_patch()
        workload.step = original_step

    undo.handle = undo_patch  # type: ignore[attr-defined]
    return workload, undo
