"""What ``levers tune`` answers: the proven stack, how it was found, and how to use it.

:class:`TuneResult` is what :meth:`levers.Step.tune` (and, for a script,
:func:`levers.tune.script.tune_script`) returns and what the command prints and records.
``apply_line`` is the line that applies the stack in the user's own script; ``reproduce_command``
the command that reproduces its proof: ``levers ab`` for a workload, ``levers tune --lever`` for a
script (``levers ab`` builds each side from a factory, which a script is not).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any

from levers.audit.script_step import apply_call, runs_hf_trainer, trainer_callback
from levers.tune.measure import TrialDesign
from levers.tune.search import Outcome, SearchResult
from levers.tune.trial import Stack, Trial


# the apply line's names where the script's are not known (a workload's factory)
_PLACEHOLDERS = {"model": "model", "optimizer": "opt"}


@dataclass(frozen=True)
class TuneResult:
    workload: str  # the spec as given
    params: dict[str, Any]
    set_items: tuple[str, ...]  # the --set items as given, for the printed command
    design: TrialDesign
    device: str
    search: SearchResult
    wraps_step: bool = False  # a lever of the stack wraps the step: the script calls handle.step
    notes: tuple[str, ...] = field(default=())
    script: tuple[str, ...] | None = None  # the command after --, when a script was tuned
    rounds: int | None = None  # a script's A/Bs: pairs of windows (C B) in one run of it
    not_tried: str | None = None  # why the search could not run at all
    # a script's names for its model and optimizer, as its probe run found them
    # (levers.integrations.script_names); None for a workload or where the probe said none
    names: dict[str, Any] | None = None

    @property
    def stack(self) -> Stack:
        return self.search.stack

    @property
    def proof(self) -> Trial | None:
        return self.search.proof

    @property
    def outcomes(self) -> tuple[Outcome, ...]:
        return self.search.outcomes

    @property
    def nothing_pays(self) -> bool:
        """No stack, and no lever paid where it was selected either (one that did, but whose
        confirmation the budget cut short, is :attr:`unconfirmed`: not "nothing pays")."""
        return not self.stack and not self.search.unconfirmed

    @property
    def unconfirmed(self) -> Stack:
        """Levers that paid where they were selected but that the budget left unconfirmed."""
        return self.search.unconfirmed

    @property
    def confirm_command(self) -> str | None:
        """``levers ab ... --lever X`` that confirms the first unconfirmed lever by hand (on top
        of the stack); None where none is, or for a script."""
        if not self.unconfirmed or self.script is not None:
            return None
        stack = ",".join((*self.stack, self.unconfirmed[0]))
        return f"{ab_prefix(self.workload, self.set_items)} {shlex.join(['--lever', stack])}"

    @property
    def interrupted(self) -> bool:
        """Ctrl-C ended the search: ``stack`` is only what a fresh A/B confirmed before it."""
        return self.search.interrupted

    @property
    def why_nothing_tried(self) -> str | None:
        """Why no A/B ran, or None when one did: "nothing tried" is not "nothing pays"."""
        if self.not_tried is not None:
            return self.not_tried
        if self.search.trials:
            return None
        if self.search.interrupted:
            return "the search was interrupted (Ctrl-C) before its first A/B"
        if self.search.out_of_budget:
            return "the time budget ran out before the first A/B; raise --budget"
        return "no lever can be tried on this step: each one was left out (below, with why)"

    @property
    def nothing_tried(self) -> bool:
        return self.why_nothing_tried is not None

    @property
    def apply_line(self) -> str | None:
        """``handle = levers.apply(model, "a,b", optimizer=opt)``, with the script's own names
        for a script (a Trainer script's: the callback that applies it); None for an empty
        stack."""
        if not self.stack:
            return None
        stack = ",".join(self.stack)
        if runs_hf_trainer(self.names):
            return f"trainer = {trainer_callback(stack)[0]}"
        names = self.names if self.script is not None and self.names else _PLACEHOLDERS
        call, _ = apply_call(names, stack, step="train_step" if self.wraps_step else None)
        return f"handle = {call}"

    @property
    def apply_note(self) -> str | None:
        """Where the apply line goes in a script, and any name levers could not find; None for
        a workload or an empty stack."""
        if not self.stack or self.script is None:
            return None
        stack = ",".join(self.stack)
        if runs_hf_trainer(self.names):
            return trainer_callback(stack)[1]
        if not self.names:
            return (
                "once the model and the optimizer are built, before the training loop; model and "
                "opt stand for your script's own names for them"
            )
        _, missing = apply_call(self.names, stack)
        names = self.names
        built = (
            f"once {names['model']} and {names['optimizer']} are built"
            if names.get("model") and names.get("optimizer")
            else "once the model and the optimizer are built"
        )
        return f"{built}, before the training loop" + (f"; {missing}" if missing else "")

    @property
    def ab_command(self) -> str | None:
        """The ``levers ab`` command that reproduces the proof; None for an empty stack or a
        script."""
        if not self.stack or self.script is not None:
            return None
        parts = ["--lever", ",".join(self.stack), "--steps", str(self.proof_steps)]
        return f"{ab_prefix(self.workload, self.set_items)} {shlex.join(parts)}"

    @property
    def proof_steps(self) -> int:
        """The timed steps per side of the proof (a confirmation may time more than the
        selection A/Bs' ``design.steps``)."""
        proof = self.proof
        return proof.num_steps if proof is not None and proof.num_steps else self.design.steps

    @property
    def reproduce_command(self) -> str | None:
        """``levers ab ...`` for a workload; for a script, ``levers tune --lever STACK ... --
        python train.py``, which measures the stack again the same way."""
        if not self.stack or self.script is None:
            return self.ab_command
        design = self.design
        parts = ["levers", "tune", "--lever", ",".join(self.stack), "--steps", str(design.steps),
                 "--warmup", str(design.warmup), "--rounds", str(self.rounds), "--", *self.script]
        return shlex.join(parts)

    def to_dict(self) -> dict[str, Any]:
        search = self.search
        return {
            "workload": self.workload,
            "params": dict(self.params),
            "device": self.device,
            "design": dict(self.design.__dict__),
            "stack": list(self.stack),
            "nothing_pays": self.nothing_pays,
            "unconfirmed": list(self.unconfirmed),
            "nothing_tried": self.why_nothing_tried,
            "interrupted": self.interrupted,
            "proof": self.proof.to_dict() if self.proof is not None else None,
            "confirmed_by": search.confirmed_by,
            "selected": list(search.selected),
            "apply_line": self.apply_line,
            "apply_note": self.apply_note,
            "names": self.names,
            "ab_command": self.ab_command,
            "reproduce_command": self.reproduce_command,
            "script": list(self.script) if self.script is not None else None,
            "rounds": self.rounds,
            "not_tried": self.not_tried,
            "outcomes": [dict(o.__dict__) for o in search.outcomes],
            "trials": [t.to_dict() for t in search.trials],
            "budget_s": search.budget_s,
            "spent_s": search.spent_s,
            "out_of_budget": search.out_of_budget,
            "notes": [*search.notes, *self.notes],
        }


def ab_prefix(workload: str, set_items: tuple[str, ...]) -> str:
    """``levers ab WORKLOAD --set ...``: the start of every ``levers ab`` command tune prints."""
    parts = ["levers", "ab", workload] + (["--set", *set_items] if set_items else [])
    return shlex.join(parts)
