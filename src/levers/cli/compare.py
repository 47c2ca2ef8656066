"""``levers compare``: a paired per-example quality read between two evaluation files.

    levers compare BASELINE CANDIDATE --metric NAME [--lower-is-better | --higher-is-better]
                   [--unpaired] [--must-match IDS] [--id-column NAME] [--resamples R]
                   [--seed S] [--json FILE] [--md FILE] [--prereg FILE [--read ID]]

Exit codes: 0 the read ran (whatever its verdict); 1 an integrity row did not match exactly;
2 bad input (a file without an id column, duplicate ids, a non-numeric metric, no overlap).

What runs the verb is imported inside its functions: ``levers --help`` loads this module and
must not import torch (:mod:`levers.cli`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from levers.cli.options import add_output_arguments
from levers.errors import LeversError
from levers.output.atomic import atomic_write_text
from levers.output.console import say_wrote

EXIT_INTEGRITY_FAILED = 1


def _ids(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "compare",
        help="is the candidate run better? paired per-example bootstrap CI95 over eval results",
        description=(
            "Compare one metric between two per-example evaluation files (.npz with one array "
            "per metric and an id array; .jsonl or .csv with an id column): the mean per-example "
            "difference candidate - baseline over the ids both hold, a seeded paired bootstrap "
            "CI95, and the verdict IMPROVED / PARITY / DAMAGED."
        ),
        epilog=(
            "Example: levers compare evals/40k.npz evals/60k.npz --metric chunk_mae "
            "--lower-is-better --must-match 17,42 --json read1.json | "
            "levers compare --prereg run.toml --read 1"
        ),
    )
    parser.add_argument(
        "baseline",
        nargs="?",
        metavar="BASELINE",
        help="the baseline's metric file",
    )
    parser.add_argument(
        "candidate",
        nargs="?",
        metavar="CANDIDATE",
        help="the candidate's metric file",
    )
    parser.add_argument("--metric", metavar="NAME", help="the metric to compare")
    better = parser.add_mutually_exclusive_group()
    better.add_argument(
        "--lower-is-better", dest="better", action="store_const", const="lower",
        help="a lower value is better (losses, errors; the default)",
    )
    better.add_argument(
        "--higher-is-better", dest="better", action="store_const", const="higher",
        help="a higher value is better (accuracy, reward)",
    )
    parser.add_argument(
        "--unpaired", action="store_true",
        help="compare each side's mean over all its rows, resampled separately (marked UNPAIRED)",
    )
    parser.add_argument(
        "--must-match", type=_ids, default=None, metavar="IDS",
        help="comma-separated example ids whose values must be identical on both sides "
        "(integrity rows; kept out of the read)",
    )
    parser.add_argument(
        "--id-column",
        default=None,
        metavar="NAME",
        help="the id column or array (default: id)",
    )
    parser.add_argument(
        "--resamples",
        type=int,
        default=10_000,
        metavar="R",
        help="bootstrap resamples (default 10000)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        metavar="S",
        help="bootstrap seed (default 0)",
    )
    add_output_arguments(parser, json="the read", md="the read")
    parser.add_argument(
        "--prereg", type=Path, metavar="FILE",
        help="a frozen pre-registration: the read is appended to FILE.record.jsonl",
    )
    parser.add_argument(
        "--read", dest="read_id", type=int, metavar="ID",
        help="with --prereg: run the frozen read ID (files, metric and direction come from it)",
    )
    parser.set_defaults(func=run)
    return parser


def _from_prereg(args: argparse.Namespace) -> dict[str, Any]:
    """The read's settings from a frozen run pre-registration; conflicting options are refused."""
    from levers.runs.prereg import load_frozen_run_prereg

    prereg, _ = load_frozen_run_prereg(args.prereg)
    read = prereg.read(args.read_id)
    folder = args.prereg.parent

    def located(name: str | None) -> str | None:
        return None if name is None else str(folder / name)

    frozen = {
        "baseline": located(read.baseline),
        "candidate": located(read.candidate),
        "metric": read.metric,
        "better": read.better,
        "unpaired": read.unpaired,
        "must_match": list(read.must_match),
        "id_column": read.id_column,
    }
    given = {
        "baseline": args.baseline and str(Path(args.baseline)),
        "candidate": args.candidate and str(Path(args.candidate)),
        "metric": args.metric,
        "better": args.better,
        "unpaired": args.unpaired or None,
        "must_match": args.must_match,
        "id_column": args.id_column,
    }
    conflicts = []
    for key, value in given.items():
        if value is None:
            continue
        if key in ("baseline", "candidate") and frozen[key] is None:
            frozen[key] = value  # the read leaves the file to the command line
        elif value != frozen[key]:
            conflicts.append(f"{key} {value!r} (registered: {frozen[key]!r})")
    if conflicts:
        raise LeversError(
            f"options contradict read {read.id} of {args.prereg}: {'; '.join(conflicts)}. Drop "
            "them, or pre-register the read you want in a new pre-registration (levers prereg "
            "init): a frozen read is never amended"
        )
    for key in ("baseline", "candidate"):
        if frozen[key] is None:
            raise LeversError(f"read {read.id} names no {key} file; give it on the command line")
    return {**frozen, "read": {"id": read.id, "name": read.name, "rule": read.rule}}


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    if args.read_id is not None:
        if args.prereg is None:
            raise LeversError("--read ID names a read of a pre-registration: add --prereg FILE")
        return _from_prereg(args)
    needed = (("BASELINE", args.baseline), ("CANDIDATE", args.candidate), ("--metric", args.metric))
    missing = [name for name, value in needed if not value]
    if missing:
        raise LeversError(
            f"give {', '.join(missing)}: levers compare BASELINE CANDIDATE --metric NAME "
            "(or run a frozen read with --prereg FILE --read ID)"
        )
    return {
        "baseline": args.baseline,
        "candidate": args.candidate,
        "metric": args.metric,
        "better": args.better or "lower",
        "unpaired": args.unpaired,
        "must_match": args.must_match or [],
        "id_column": args.id_column or "id",
        "read": None,
    }


def run(args: argparse.Namespace) -> int:
    from levers.runs.compare import compare, comparison_document, summary_lines, to_markdown
    from levers.runs.metric_files import read_metric
    from levers.ab.record import append_event, to_json

    if args.resamples < 100:
        raise LeversError(f"use at least 100 resamples for a CI, got --resamples {args.resamples}")
    settings = _settings(args)
    from levers.capture.json_io import check_writable

    for path in (args.json_path, args.md_path):
        if path is not None:  # before the read, which a later failed write would lose
            check_writable(path, make_parents=True)
    state = None
    if args.prereg is not None:
        from levers.runs.prereg import frozen_state

        # checked before any work: a record that cannot vouch for the file takes no result
        state = frozen_state(args.prereg, freeze_command="levers prereg freeze")
    baseline = read_metric(
        settings["baseline"],
        settings["metric"],
        id_column=settings["id_column"],
    )
    candidate = read_metric(
        settings["candidate"],
        settings["metric"],
        id_column=settings["id_column"],
    )
    comparison = compare(
        baseline,
        candidate,
        better=settings["better"],
        unpaired=settings["unpaired"],
        must_match=settings["must_match"],
        num_resamples=args.resamples,
        seed=args.seed,
    )
    options = {
        k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "func"
    }
    document = comparison_document(comparison, options)
    document["read"] = settings["read"]
    # the result first: a write that fails after it does not lose the read
    if settings["read"] is not None:
        read = settings["read"]
        print(f"read {read['id']} ({read['name']}): {read['rule']}")
    for line in summary_lines(comparison):
        print(line)
    sys.stdout.flush()
    if state is not None:
        document["prereg"] = {"sha256": state.sha256, "num_amendments": state.num_amendments}
        append_event(state.record_path, document)
    if args.json_path is not None:
        atomic_write_text(args.json_path, to_json(document) + "\n", make_parents=True)
    if args.md_path is not None:
        atomic_write_text(args.md_path, to_markdown(comparison), make_parents=True)
    for path in (state and state.record_path, args.json_path, args.md_path):
        if path:
            say_wrote(path)
    return EXIT_INTEGRITY_FAILED if comparison.integrity_passed is False else 0
