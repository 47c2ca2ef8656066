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

from levers.tune.measure import TrialDesign
from levers.tune.search import Outcome, SearchResult
from levers.tune.trial import Stack, Trial


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
        return not self.stack

    @property
    def apply_line(self) -> str | None:
        """``handle = levers.apply(model, "a,b", optimizer=opt)``; None for an empty stack."""
        if not self.stack:
            return None
        step = ", step=train_step" if self.wraps_step else ""
        return f'handle = levers.apply(model, "{",".join(self.stack)}", optimizer=opt{step})'

    @property
    def ab_command(self) -> str | None:
        """The ``levers ab`` command that reproduces the proof; None for an empty stack or a
        script."""
        if not self.stack or self.script is not None:
            return None
        parts = ["--lever", ",".join(self.stack), "--steps", str(self.design.steps)]
        return f"{ab_prefix(self.workload, self.set_items)} {shlex.join(parts)}"

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
            "proof": self.proof.to_dict() if self.proof is not None else None,
            "apply_line": self.apply_line,
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
