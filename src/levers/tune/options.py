"""What the user asks of one ``levers tune`` search, declared once.

``levers tune``'s flags and :meth:`levers.Step.tune`'s keywords become one :class:`TuneOptions`
at the border (:meth:`TuneOptions.checked`: the budget read, the A/B design's defaults filled in
and checked, the lever ids and the record's path checked, all before the workload is built or the
script runs), and the record is passed whole to the search of a factory
(:func:`levers.tune.run.tune_step`) or of a script (:func:`levers.tune.script.tune_script`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass

from levers.ab.record import check_record
from levers.levers import load_all
from levers.levers.handle import parse_ids
from levers.tune.budget import DEFAULT_BUDGET, parse_duration_s
from levers.tune.candidates import check_ids
from levers.tune.measure import TrialDesign


@dataclass(frozen=True)
class TuneOptions:
    """One search's options.

    ``budget_s``: the search's time budget in seconds. ``only``: the lever ids it may try (None:
    all); ``exclude``: ids it never tries. ``design``: the A/B design every trial shares.
    ``rounds``: a script's windows of timed steps per side (None: the default; a factory's A/Bs
    alternate single steps and take none). ``use_audit``: take the candidates' order from an
    audit of the step (else from the catalogue alone). ``record_path``: the JSON-lines file each
    A/B and the result are appended to (None: none). ``set_items``: the ``--set`` items as typed,
    for the printed ``levers ab`` command.
    """

    budget_s: float = parse_duration_s(DEFAULT_BUDGET)
    only: tuple[str, ...] | None = None
    exclude: tuple[str, ...] = ()
    design: TrialDesign = TrialDesign()
    rounds: int | None = None
    use_audit: bool = True
    record_path: str | os.PathLike | None = None
    set_items: tuple[str, ...] = ()

    @classmethod
    def checked(
        cls,
        *,
        budget: str | float | None = None,
        levers: str | Iterable[str] | None = None,
        exclude: str | Iterable[str] = (),
        steps: int | None = None,
        warmup: int | None = None,
        parity_steps: int | None = None,
        resamples: int | None = None,
        seed: int = 0,
        rounds: int | None = None,
        audit: bool = True,
        record: str | os.PathLike | None = None,
        set_items: Iterable[str] = (),
    ) -> TuneOptions:
        """The record of what the user gave, each value checked; None takes the default.

        Raises:
            ValueError: an unreadable budget (the message starts with ``--budget:``), a design
                ab cannot run, a lever id the catalogue does not hold, or a record that is not
                writable.
        """
        try:
            budget_s = parse_duration_s(DEFAULT_BUDGET if budget is None else budget)
        except ValueError as exc:
            raise ValueError(f"--budget: {exc}") from None
        defaults = TrialDesign()
        design = TrialDesign(
            steps=defaults.steps if steps is None else steps,
            warmup=defaults.warmup if warmup is None else warmup,
            parity_steps=defaults.parity_steps if parity_steps is None else parity_steps,
            resamples=defaults.resamples if resamples is None else resamples,
            seed=seed,
        )
        only = None if levers is None else tuple(parse_ids(levers))
        left_out = tuple(parse_ids(exclude)) if exclude else ()
        check_ids(load_all(), [*(only or ()), *left_out])
        if record is not None:
            check_record(record)
        return cls(budget_s, only, left_out, design, rounds, audit, record, tuple(set_items))
