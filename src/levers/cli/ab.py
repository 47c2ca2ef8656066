"""``levers ab``: a pre-registered, parity-gated A/B comparison of two training steps.

    levers ab BASELINE [CANDIDATE] [--set K=V ...] [--set-b K=V ...] [--lever NAME ...]
              [--prereg FILE | --init-prereg FILE] [--parity-steps K] [--steps N] [--warmup W]
              [--json FILE] [--md FILE] [--resamples R] [--seed S] [--mem-gate-gib X]
              [--time-budget-s T] [--sides together|one-at-a-time] [--exact | --changes-numerics]

Exit codes: 0 the comparison ran (whatever its verdicts); 2 bad input or a refused
pre-registration; 3 a side's step raised; 4 a kill line stopped the run (what was measured is
still written).

What runs the verb is imported inside its functions: ``levers --help`` loads this module and
must not import torch (:mod:`levers.cli`).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from levers.ab.design_keys import DEFAULTS_BY_KEY, SIDES
from levers.cli import EXIT_INTERRUPTED
from levers.errors import LeversError, StepError
from levers.text_files import read_utf8
from levers.cli.options import (
    add_lever_argument,
    add_output_arguments,
    add_set_argument,
    add_steps_argument,
    add_warmup_argument,
    add_workload_argument,
    count,
    positive_seconds,
)
from levers.output.atomic import atomic_write_text
from levers.output.console import say_wrote
from levers.vocab import CHANGES_NUMERICS

EXIT_KILLED = 4


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {value}")
    return value


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "ab",
        help="did it help? a pre-registered, parity-gated A/B with CI95 verdicts",
        description=(
            "Compare a candidate training step with a baseline: a parity gate on losses and "
            "gradient norms first, then alternating timed steps; step time, tokens/s and peak "
            "memory as candidate/baseline ratios with paired bootstrap CI95, each judged "
            "IMPROVED / PARITY / DAMAGED."
        ),
        epilog=(
            "Examples: levers ab demo --set-b fixed=all | levers ab demo demo (A/A noise floor) "
            "| levers ab --init-prereg ab.toml demo --set-b fixed=all, edit it, then "
            "levers ab --prereg ab.toml. Put the workloads before --set/--set-b, which take "
            "every KEY=VALUE after them."
        ),
    )
    add_workload_argument(parser, "baseline", metavar="BASELINE")
    add_workload_argument(
        parser, "candidate", metavar="CANDIDATE", help="the candidate's workload (default: BASELINE)"
    )
    add_set_argument(parser, help="a factory parameter for both sides")
    add_set_argument(
        parser, "--set-b", dest="set_b_items", help="a factory parameter for the candidate only (over --set)"
    )
    add_lever_argument(parser, help="apply this lever to the candidate (repeatable)")
    prereg = parser.add_mutually_exclusive_group()
    prereg.add_argument(
        "--prereg",
        type=Path,
        metavar="FILE",
        help="run the design frozen in this pre-registration; results are "
        "appended to FILE.record.jsonl",
    )
    prereg.add_argument(
        "--init-prereg",
        type=Path,
        metavar="FILE",
        help="write a pre-registration template (filled with the given design) and stop",
    )
    parser.add_argument(
        "--parity-steps",
        type=count,
        metavar="K",
        help=f"steps compared by the parity gate (default {DEFAULTS_BY_KEY['parity_steps']}; "
        "0 skips it)",
    )
    add_steps_argument(parser, default=f"{DEFAULTS_BY_KEY['steps']} per side")
    add_warmup_argument(
        parser, default=f"{DEFAULTS_BY_KEY['warmup']} per side, after the parity gate"
    )
    parser.add_argument(
        "--resamples",
        type=count,
        metavar="R",
        help=f"bootstrap resamples per CI (default {DEFAULTS_BY_KEY['resamples']})",
    )
    parser.add_argument(
        "--seed",
        type=int,
        metavar="S",
        help=f"seed of both workloads and of the bootstrap (default {DEFAULTS_BY_KEY['seed']})",
    )
    parser.add_argument(
        "--mem-gate-gib",
        type=_positive_float,
        metavar="X",
        help="kill the run if a side's peak allocated exceeds X GiB (GPU)",
    )
    parser.add_argument(
        "--time-budget-s",
        type=_positive_float,
        metavar="T",
        help="kill the run once it has taken T seconds",
    )
    parser.add_argument(
        "--sides",
        choices=SIDES,
        default=SIDES[0],
        help="together (default): both sides on the device, alternating (on one GPU in windows "
        "of about half a second of steps, elsewhere step by step); "
        "one-at-a-time: each side built, checked and timed alone, then freed, for steps two of "
        "which do not fit the device (a drift between the two blocks lands on the ratio)",
    )
    exactness = parser.add_mutually_exclusive_group()
    exactness.add_argument(
        "--exact",
        dest="exactness",
        action="store_const",
        const="exact",
        help="the change must not alter the math (held to the baseline, tight tolerance)",
    )
    exactness.add_argument(
        "--changes-numerics",
        # the flag's older spelling, still accepted
        "--numerics-changing",
        dest="exactness",
        action="store_const",
        const=CHANGES_NUMERICS,
        help="the change may alter rounding (default; judged against a float64 run)",
    )
    add_output_arguments(
        parser, json="the whole result (every sample)", md="the result, ready for a pull request"
    )
    parser.add_argument(
        "--dist-timeout",
        type=positive_seconds,
        default=300.0,
        metavar="S",
        help="under torchrun: seconds rank 0 waits for the other ranks' step times, and they for "
        "its outcome, before naming the rank that did not answer (default: 300)",
    )
    parser.set_defaults(func=run)
    return parser


def _given(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    """The design keys and kill lines the user set explicitly on the command line."""
    from levers.loader import parse_set

    design: dict[str, Any] = {
        "baseline": args.baseline,
        "candidate": args.candidate,
        "params": parse_set(args.set_items) if args.set_items else None,
        "params_b": parse_set(args.set_b_items) if args.set_b_items else None,
        "levers": list(args.levers) or None,
        "exactness": args.exactness,
        "steps": args.steps,
        "warmup": args.warmup,
        "parity_steps": args.parity_steps,
        "resamples": args.resamples,
        "seed": args.seed,
    }
    kill = {"mem_gate_gib": args.mem_gate_gib, "time_budget_s": args.time_budget_s}
    return (
        {k: v for k, v in design.items() if v is not None},
        {k: v for k, v in kill.items() if v is not None},
    )


def _init_prereg(path: Path, given: dict[str, Any]) -> int:
    from levers.ab.prereg import template
    from levers.capture.json_io import check_writable

    check_writable(path, make_parents=True)
    try:
        atomic_write_text(path, template(given), exclusive=True, make_parents=True)
    except OSError as exc:
        raise LeversError(f"cannot write {path}: {exc.strerror or exc}; choose another path") from None
    say_wrote(path)
    # the next step is this command's output proper, so it goes to stdout
    print(
        f"state the question, the numbered expectations and the decision rule in {path}, "
        f"then run: levers ab --prereg {path}"
    )
    return 0


def _check_outputs(args: argparse.Namespace) -> None:
    """Every file the run will write can be written: checked before the first step."""
    from levers.ab.record import check_record, record_path_for
    from levers.capture.json_io import check_writable

    for path in (args.json_path, args.md_path):
        if path is not None:
            check_writable(path, make_parents=True)
    if args.prereg is not None:
        check_record(record_path_for(args.prereg))


def run(args: argparse.Namespace) -> int:
    from levers.ab import design as design_mod
    from levers.ab.freeze import freeze
    from levers.ab.prereg import parse_prereg
    from levers.api import Step
    from levers.distributed.world import world_from_env

    given, given_kill = _given(args)
    if args.init_prereg is not None:
        return _init_prereg(args.init_prereg, {**given, **given_kill})
    prereg = state = None
    if args.prereg is not None:
        if not args.prereg.is_file():
            raise LeversError(
                f"no pre-registration at {args.prereg}; write one with: "
                f"levers ab --init-prereg {args.prereg} BASELINE ..."
            )
        parsed = parse_prereg(read_utf8(args.prereg), str(args.prereg))
        # everything is checked before the file is frozen: a refused run freezes nothing
        design, kill = design_mod.resolve(given, given_kill, parsed)
        design_mod.config(design, kill, design["exactness"] or CHANGES_NUMERICS)
        _check_outputs(args)
        if world_from_env().is_leader:
            prereg, state = freeze(args.prereg)
        else:  # under torchrun only rank 0 freezes and records
            prereg, state = parsed, None
    elif "baseline" not in given:
        raise LeversError(
            "name the BASELINE workload (e.g. levers ab demo --set-b fixed=all), "
            "or run a pre-registration with --prereg FILE"
        )
    design, kill = design_mod.resolve(given, given_kill, prereg)
    if args.prereg is not None:
        design = design_mod.relative_to(design, args.prereg.parent)
    _, _, exactness = design_mod.sides(design)
    design_mod.config(design, kill, exactness, args.sides)  # a design that cannot run is refused
    _check_outputs(args)
    # under torchrun: both sides on every rank; the verdict and the record from rank 0
    result = Step(design["baseline"], design["params"]).ab(
        candidate=design["candidate"],
        levers=design["levers"],
        params_b=design["params_b"],
        exactness=design["exactness"],
        steps=design["steps"],
        warmup=design["warmup"],
        parity_steps=design["parity_steps"],
        resamples=design["resamples"],
        seed=design["seed"],
        mem_gate_gib=kill.get("mem_gate_gib"),
        time_budget_s=kill.get("time_budget_s"),
        dist_timeout_s=args.dist_timeout,
        sides=args.sides,
    )
    if result is None:  # a rank other than 0
        return 0
    return _finish(args, result, prereg, state)




def _finish(args: argparse.Namespace, result: Any, prereg: Any, state: Any) -> int:
    """Record, write and print a finished (or stopped) run; a failed write loses nothing."""
    from levers.ab.document import result_document
    from levers.environment import environment
    from levers.ab.expectations import evaluate
    from levers.ab.markdown import to_markdown
    from levers.ab.record import append_event, to_json
    from levers.ab.render import print_result

    device = result.baseline.device if result.baseline else "cpu"
    env = environment(device, cwd=Path.cwd())
    outcomes = evaluate(prereg.expectations, result) if prereg is not None else ()
    options = {k: v for k, v in vars(args).items() if k != "func"}
    document = result_document(result, env, freeze=state, outcomes=outcomes, options=options)
    interrupted = result.killed is not None and result.killed.kind == "interrupted"
    if interrupted:
        document["partial"] = True  # what was measured before Ctrl-C, not a finished run
    writes = []
    if state is not None:
        writes.append((state.record_path, lambda p: append_event(p, document)))
    if args.json_path is not None:
        writes.append(
            (args.json_path, lambda p: atomic_write_text(p, to_json(document) + "\n", make_parents=True))
        )
    if args.md_path is not None:
        writes.append(
            (
                args.md_path,
                lambda p: atomic_write_text(
                    p, to_markdown(result, env, outcomes, state), make_parents=True
                ),
            )
        )
    written, failed = [], []
    for path, write in writes:
        try:
            write(path)
            written.append(str(path))
        except (OSError, LeversError) as exc:
            failed.append(f"{path} ({_short(exc)})")
    print_result(result, outcomes)
    for path in written:
        say_wrote(path)
    if failed:
        fallback = _save_fallback(to_json(document) + "\n")
        raise LeversError(
            f"could not write {'; '.join(failed)}. The result is saved in {fallback}"
            + (": append that line to the record by hand once it is repaired" if state else "")
        )
    if result.killed is None:
        return 0
    if interrupted:
        where = _kept_in(written, to_json(document) + "\n")
        print(f"levers: interrupted: the partial result is kept in {where}", file=sys.stderr)
        return EXIT_INTERRUPTED
    if result.killed.kind == "step_error":
        raise StepError(
            f"{result.killed.message} (what was measured before it is written)",
            user_traceback=result.killed.user_traceback,
        )
    return EXIT_KILLED


def _kept_in(written: list[str], text: str) -> str:
    """Where a stopped run's partial result is: the files written, else a fallback file."""
    if written:
        return ", ".join(written)
    return f"{_save_fallback(text)} (give --json FILE to choose the file)"


def _short(exc: BaseException) -> str:
    if isinstance(exc, OSError):
        return exc.strerror or type(exc).__name__
    return str(exc).split(";")[0]


def _save_fallback(text: str) -> Path:
    """Somewhere the result can still go: the current directory, else the temp directory."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    for directory in (Path.cwd(), Path(tempfile.gettempdir())):
        path = directory / f"levers-ab-result-{stamp}-{os.getpid()}.json"
        try:
            with open(path, "x", encoding="utf-8") as handle:
                handle.write(text)
            return path
        except OSError:
            continue
    raise LeversError("the result could not be saved anywhere (current or temp directory)")
