"""The ``-- python train.py`` form of ``levers audit`` and ``levers memory``: options and runs.

``levers.cli`` splits the command line at the first ``--``; what follows is the script's command
(``args.script_command``). A verb that takes it calls :func:`add_script_arguments` and
:func:`capture_script`.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Any

from levers.errors import LeversError

# a script's first optimizer steps pay for compilation, allocator growth and data workers
SCRIPT_WARMUP = 2
SCRIPT_TIMED = 0

SCRIPT_HELP = (
    "After --, the command that runs your training script unchanged: -- python train.py [args] "
    "or -- python -m package.train [args]. levers runs it in this process, lets the warm-up "
    f"optimizer steps pass (default for a script: {SCRIPT_WARMUP}), captures the next whole "
    "step (from one optimizer.step() to the next), then stops the script unless --keep-running."
)


def add_script_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("a script after --")
    group.add_argument(
        "--keep-running",
        action="store_true",
        help="let the script run to its end after the captured step (default: stop it there)",
    )
    group.add_argument(
        "--tokens-per-step",
        type=int,
        default=None,
        metavar="N",
        help="tokens (or samples) one step of the script consumes, for tokens/s",
    )
    parser.set_defaults(takes_script=True)


@dataclass(frozen=True)
class ScriptCapture:
    capture: Any  # levers.capture.Capture
    workload: Any  # levers.Workload (model and optimizer found in the script)
    exit_code: int  # the script's own exit code (0 when levers stopped it)


def capture_script(args: argparse.Namespace, *, warmup: int, timed: int) -> ScriptCapture | int:
    """Run the script of ``args.script_command``; the capture, or the exit code to end with.

    A script that fails before a step is captured keeps its exit code (its traceback printed as
    Python prints it) and levers adds one line on what it saw. A script that ends cleanly before
    that is a usage problem (exit 2): it ran too few steps for the warm-up asked for.
    """
    from levers.integrations.script import parse_command, run_script
    from levers.output.progress import progress_status

    if warmup < 1:
        raise LeversError(
            "a script's capture starts at an optimizer step: --warmup must be at least 1"
        )
    if args.tokens_per_step is not None and args.tokens_per_step <= 0:
        raise LeversError(f"--tokens-per-step must be positive, got {args.tokens_per_step}")
    command = parse_command(args.script_command)
    with progress_status() as progress:
        run = run_script(
            command,
            warmup=warmup,
            timed=timed,
            keep_running=args.keep_running,
            tokens_per_step=args.tokens_per_step,
            progress=progress.on_ops,
        )
    if run.capture is None:
        if run.exit_code != 0:
            print(f"levers: {command.display} exited with {run.exit_code}; {run.saw}", file=sys.stderr)
            return run.exit_code
        raise LeversError(
            f"{command.display} ended before levers captured a step: {run.saw}; run more steps "
            "or lower --warmup"
        )
    if run.exit_code != 0:
        print(
            f"levers: {command.display} exited with {run.exit_code} after the captured step",
            file=sys.stderr,
        )
    return ScriptCapture(run.capture, run.workload, run.exit_code)


def reject_workload(args: argparse.Namespace, verb: str) -> None:
    if getattr(args, "workload", None) is not None:
        raise LeversError(
            f"levers {verb} got both a workload ({args.workload}) and a script after --; give one"
        )
