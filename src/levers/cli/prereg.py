"""``levers prereg``: write, freeze, check and annotate a training run's pre-registration.

    levers prereg init FILE          write a template to fill in
    levers prereg freeze FILE        validate and freeze it (or freeze an appended amendment)
    levers prereg check FILE         is it frozen and unchanged? (what RunGuard.from_prereg needs)
    levers prereg note FILE TEXT     append a verification note to its record

Exit codes: 0 done; 2 a malformed file, an edit of frozen text, or a file that is not frozen.

What runs the verb is imported inside its functions: ``levers --help`` loads this module and
must not import torch (:mod:`levers.cli`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from levers.output.atomic import atomic_write_text
from levers.output.console import say_wrote


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "prereg",
        help="pre-register a training run: a frozen design, gates, kill lines and reads",
        description=(
            "A training run's pre-registration: question, design, gates (the dataset banner), "
            "kill lines, frozen reads with their decision rule and numbered expectations, frozen "
            "before the run into an append-only record. levers.RunGuard.from_prereg(FILE) reads "
            "the kill lines and gates from it."
        ),
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    init = actions.add_parser("init", help="write a run pre-registration template to fill in")
    init.add_argument("path", type=Path, metavar="FILE")
    init.set_defaults(func=_init)
    freeze = actions.add_parser("freeze", help="validate and freeze FILE (or its new amendment)")
    freeze.add_argument("path", type=Path, metavar="FILE")
    freeze.set_defaults(func=_freeze)
    check = actions.add_parser("check", help="check that FILE is frozen and unchanged since")
    check.add_argument("path", type=Path, metavar="FILE")
    check.set_defaults(func=_check)
    note = actions.add_parser("note", help="append a verification note to FILE's record")
    note.add_argument("path", type=Path, metavar="FILE")
    note.add_argument("text", metavar="TEXT", help="what was checked and what it showed")
    note.set_defaults(func=_note)
    return parser


def _init(args: argparse.Namespace) -> int:
    from levers.runs.prereg import template

    atomic_write_text(args.path, template(), exclusive=True, make_parents=True)
    say_wrote(args.path)
    print(
        f"{args.path}: fill in the question, design, gates, kill lines, reads, expectations "
        f"and decision rule, then freeze it before the run: levers prereg freeze {args.path}"
    )
    return 0


def _freeze(args: argparse.Namespace) -> int:
    from levers.runs.prereg import freeze_run_prereg

    prereg, state = freeze_run_prereg(args.path)
    words = {
        "new": "frozen",
        "amended": "amendment frozen",
        "unchanged": "already frozen, unchanged",
    }
    print(
        f"{args.path}: {words[state.status]} (sha256 {state.sha256[:12]}, "
        f"{state.num_amendments} amendment(s), {len(prereg.expectations)} expectation(s), "
        f"{len(prereg.reads)} read(s)); record: {state.record_path}"
    )
    return 0


def _check(args: argparse.Namespace) -> int:
    from levers.runs.prereg import guard_settings, load_frozen_run_prereg

    prereg, state = load_frozen_run_prereg(args.path)
    settings = guard_settings(prereg)
    bars = ", ".join(
        f"{b.name} {'>' if b.better == 'lower' else '<'} {b.bar:g} x{b.num_evals} "
        f"after {b.after_step}"
        for b in settings["metric_bars"]
    )
    print(
        f"{args.path}: frozen and unchanged (sha256 {state.sha256[:12]}, "
        f"{state.num_amendments} amendment(s))"
    )
    print(f"  banner gate: {settings['banner']}")
    print(
        f"  kill lines: nonfinite loss; mem gate {settings['mem_gate_gib']} GiB; step time "
        f"x{settings['step_time_max_ratio']}; metrics: {bars or 'none'}"
    )
    return 0


def _note(args: argparse.Namespace) -> int:
    from levers.runs.prereg import append_note

    append_note(args.path, args.text)
    print(f"note appended to the record of {args.path}")
    return 0
