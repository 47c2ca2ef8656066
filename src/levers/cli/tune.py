"""``levers tune``: the fastest stack of levers that keeps parity on this step, by paired A/B.

    levers tune WORKLOAD [--set K=V ...] [--budget 10m] [--lever A,B] [--exclude C]
                [--steps N] [--warmup W] [--parity-steps K] [--resamples R] [--seed S]
                [--record FILE] [--json FILE] [--no-audit]
    levers tune [the same options] [--rounds R] -- python train.py [its arguments]

Parses, calls :meth:`levers.Step.tune` (for a script, :func:`levers.tune.script.tune_script`),
renders; nothing else (the logic is in :mod:`levers.tune`). Exit codes: 0 the search ran (a
stack, "nothing pays here" or "nothing tried"); 2 bad input; 3 the workload's step (or the
script) raised; 130 Ctrl-C (during the search: what it found so far is printed, marked
interrupted, and recorded).

What runs the verb is imported inside its functions: ``levers --help`` loads this module and
must not import torch (:mod:`levers.cli`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import levers
from levers.cli import EXIT_INTERRUPTED
from levers.errors import LeversError
from levers.script_defaults import TUNE_SCRIPT_STEPS
from levers.tune.budget import DEFAULT_BUDGET
from levers.cli.options import (
    add_lever_argument,
    add_output_arguments,
    add_set_argument,
    add_steps_argument,
    add_warmup_argument,
    add_workload_argument,
    count,
    lever_ids,
    output_path,
)
from levers.cli.script import reject_factory_arguments
from levers.output.atomic import atomic_write_text
from levers.output.console import say_wrote
from levers.output.progress import progress_status

DEFAULT_RECORD = "levers-tune.record.jsonl"



def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "tune",
        help="what should I turn on, here? the fastest stack that keeps parity, by A/B",
        description=(
            "Search the fastest stack of levers that keeps parity on this step: candidates from "
            "the audit's findings and the catalogue, each added to the stack only when its "
            "paired A/B pays (CI95 of the tokens/s ratio above 1, parity held), the whole stack "
            "proven against the baseline, within a time budget. Prints the stack, the line that "
            "applies it and the levers ab command that reproduces it; appends a record."
        ),
        epilog=(
            "Example: levers tune demo --budget 2m | levers tune train.py:factory --set "
            "batch_size=8 | levers tune --budget 20m -- python train.py --steps 100 (a script: "
            "each A/B is one run of it, the levers applied inside it after its first 2 optimizer "
            "steps and undone and applied again in windows of steps, candidate first: C B B C; "
            "it must run at least 2 + --parity-steps + (--rounds + 1) x --warmup + 2 x --steps "
            f"optimizer steps, {TUNE_SCRIPT_STEPS} with the defaults)"
        ),
    )
    add_workload_argument(parser)
    add_set_argument(parser, help="a factory parameter")
    parser.add_argument(
        "--budget", default=DEFAULT_BUDGET, metavar="TIME",
        help="time for the whole search: 10m, 90s, 1h (default 10m)",
    )
    add_lever_argument(
        parser, metavar="IDS", help="try only these levers (repeatable, or comma-separated)"
    )
    parser.add_argument(
        "--exclude", action="append", default=[], metavar="IDS",
        help="never try these levers (repeatable, or comma-separated)",
    )
    add_steps_argument(parser, default="20 per side per A/B")
    add_warmup_argument(parser, default="3 per side per A/B; for a script, 3 per window")
    parser.add_argument("--parity-steps", type=count, metavar="K", help="steps the parity gate compares (default 3)")
    parser.add_argument("--resamples", type=count, metavar="R", help="bootstrap resamples per CI (default 2000)")
    parser.add_argument("--seed", type=int, default=0, metavar="S", help="seed of the workloads and the bootstrap")
    parser.add_argument(
        "--rounds", type=count, metavar="R",
        help="a script after --: pairs of windows of steps per A/B in one run of the script, "
        "each pair in the other order from the one before (C B B C, default 2); --steps are "
        "shared between them, and a window after a switch of side starts with --warmup untimed "
        "steps",
    )
    parser.add_argument(
        "--no-audit", dest="audit", action="store_false",
        help="take the candidates from the catalogue alone (no capture of the step)",
    )
    parser.add_argument(
        "--record", type=output_path, default=output_path(DEFAULT_RECORD), metavar="FILE",
        help=f"append each A/B and the result to this JSON-lines file (default {DEFAULT_RECORD})",
    )
    add_output_arguments(parser, json="the result")
    parser.set_defaults(func=run, takes_script=True)
    return parser


def run(args: argparse.Namespace) -> int:
    from levers.capture.json_io import check_writable
    from levers.loader import parse_set

    if getattr(args, "script_command", None) is not None:
        return _run_script(args)
    if args.rounds is not None:
        raise LeversError(
            "--rounds is for a script after --; a workload's A/Bs alternate its steps"
        )
    if args.workload is None:
        raise LeversError("name the WORKLOAD to tune (e.g. levers tune demo --budget 2m)")
    options = _options(args)
    if args.json_path is not None:
        check_writable(args.json_path, make_parents=True)
    params = parse_set(args.set_items) if args.set_items else {}
    step = levers.Step(args.workload, params=params)
    try:
        with progress_status() as progress:
            result = step.tune(options=options, progress=progress.say)
    except ValueError as exc:
        raise LeversError(str(exc)) from None
    return _show(result, args)


def _run_script(args: argparse.Namespace) -> int:
    """``levers tune [options] -- python train.py``: every check before the first run."""
    from levers.capture.json_io import check_writable
    from levers.integrations.script import parse_command
    from levers.tune.script import tune_script

    reject_factory_arguments(args, "tune")
    command = parse_command(args.script_command)
    words = command.words
    for note in command.notes:
        print(f"levers: note: {note}", file=sys.stderr)
    options = _options(args)
    if args.json_path is not None:
        check_writable(args.json_path, make_parents=True)
    try:
        with progress_status() as progress:
            result = tune_script([*words, *command.args], options, say=progress.say)
    except ValueError as exc:
        raise LeversError(str(exc)) from None
    return _show(result, args)


def _options(args: argparse.Namespace) -> Any:
    """The search's options (:class:`levers.tune.options.TuneOptions`) from the command line,
    each checked before the workload is built or the script runs.

    Raises:
        LeversError: a bad budget, design, lever id or record path, with what to pass instead.
    """
    from levers.tune.measure import TrialDesign
    from levers.tune.options import TuneOptions
    from levers.tune.script import ScriptDesign

    try:
        options = TuneOptions.checked(
            budget=args.budget,
            levers=lever_ids(args.levers) or None,
            exclude=lever_ids(args.exclude, "--exclude"),
            steps=args.steps,
            warmup=args.warmup,
            parity_steps=args.parity_steps,
            resamples=args.resamples,
            seed=args.seed,
            rounds=args.rounds,
            audit=args.audit,
            record=args.record,
            set_items=args.set_items or (),
        )
        if options.rounds is not None:
            ScriptDesign(TrialDesign(), rounds=options.rounds)  # --rounds below 1 refused now
    except ValueError as exc:
        raise LeversError(str(exc)) from None
    return options


def _show(result: Any, args: argparse.Namespace) -> int:
    """Print the answer; say where the record (and the JSON) went."""
    from levers.ab.record import to_json
    from levers.tune.render import print_tune

    print_tune(result)
    say_wrote(args.record)
    if args.json_path is not None:
        atomic_write_text(args.json_path, to_json(result.to_dict()) + "\n", make_parents=True)
        say_wrote(args.json_path)
    if result.interrupted:
        print(f"levers: interrupted: the A/Bs run so far and the result are kept in "
              f"{args.record}", file=sys.stderr)
        return EXIT_INTERRUPTED
    return 0
