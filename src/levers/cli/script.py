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

from levers.cli.options import positive_count
from levers.errors import LeversError
from levers.script_defaults import SCRIPT_TIMED, SCRIPT_WARMUP

SCRIPT_HELP = (
    "After --, the command that runs your training script unchanged: -- python train.py [args] "
    "or -- python -m package.train [args]. levers runs it in this process, lets the warm-up "
    f"optimizer steps pass (default for a script: {SCRIPT_WARMUP}), captures the next whole "
    "step (from one optimizer.step() to the next), then stops the script unless --keep-running."
)


def add_script_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of the ``-- python train.py`` form (the verb declares ``--warmup`` itself,
    with :func:`levers.cli.options.add_warmup_argument`)."""
    group = parser.add_argument_group("a script after --")
    group.add_argument(
        "--keep-running",
        action="store_true",
        help="let the script run to its end after the captured step (default: stop it there)",
    )
    group.add_argument(
        "--tokens-per-step",
        type=positive_count,
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
    for note in command.notes:
        print(f"levers: note: {note}", file=sys.stderr)
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


# what a workload does instead of each option of the script form
_SCRIPT_ONLY = {
    "--keep-running": "levers runs a workload's steps itself, and no more of them",
    "--tokens-per-step": "a workload's factory sets it: levers.Workload(tokens_per_step=...)",
}


def reject_script_options(
    args: argparse.Namespace, verb: str, extra: dict[str, tuple[str, str]] | None = None
) -> None:
    """Refuse the options of the ``-- python train.py`` form when a workload is given instead:
    they would be accepted and do nothing. ``extra``: the verb's own such options, flag ->
    (dest, what a workload does instead); given when not None."""
    given = {
        "--keep-running": args.keep_running,
        "--tokens-per-step": args.tokens_per_step is not None,
        **{flag: getattr(args, dest, None) is not None for flag, (dest, _) in (extra or {}).items()},
    }
    why = {**_SCRIPT_ONLY, **{flag: text for flag, (_, text) in (extra or {}).items()}}
    asked = [flag for flag, is_given in given.items() if is_given]
    if asked:
        names = " and ".join(asked)
        raise LeversError(
            f"{names} {'is' if len(asked) == 1 else 'are'} for a script after -- (levers {verb} "
            f"-- python train.py), not a workload ({'; '.join(f'{f}: {why[f]}' for f in asked)}); "
            f"drop {names}"
        )


def reject_workload(args: argparse.Namespace, verb: str) -> None:
    if getattr(args, "workload", None) is not None:
        raise LeversError(
            f"levers {verb} got both a workload ({args.workload}) and a script after --; give one"
        )


def run_memory(args: argparse.Namespace, console: Any) -> int:
    """``levers memory -- python train.py``: the captured step's own peak, and what cannot be said.

    The memory model predicts a step by building its workload under fake tensors, which needs a
    factory; a script builds its model as it runs. So for a script levers reports the peak it saw
    in the captured step (the CUDA allocator's on a GPU, tracked tensor storages on a CPU) and
    says that the prediction for another GPU, the what-ifs and ``--fit`` need a factory.
    """
    from levers.audit.summary import module_label
    from levers.units import format_bytes

    warmup = SCRIPT_WARMUP if args.warmup is None else args.warmup
    ran = capture_script(args, warmup=warmup, timed=0)
    if isinstance(ran, int):
        return ran
    capture = ran.capture
    mem = capture.memory
    on_gpu = mem.source == "cuda-allocator"
    how = (
        f"measured by the CUDA caching allocator on {capture.env.get('device_name')}"
        if on_gpu
        else f"tracked tensor storages on {capture.env.get('device_name')} (not a GPU prediction)"
    )
    console.print()
    console.print(f"levers memory {capture.workload}: optimizer step {warmup + 1} of the script, {how}", markup=False, soft_wrap=True)
    label = "peak allocated" if on_gpu else "peak tracked  "
    console.print(f"  {label}   {format_bytes(mem.peak_bytes)}", markup=False, soft_wrap=True)
    if mem.peak_reserved_bytes is not None:
        console.print(f"  peak reserved    {format_bytes(mem.peak_reserved_bytes)}", markup=False, soft_wrap=True)
    console.print(
        f"  at step start    {format_bytes(mem.start_bytes)} (parameters, gradients, optimizer "
        "state and whatever else the script keeps)",
        markup=False,
    )
    if mem.peak_op is not None and mem.peak_op < len(capture.ops):
        op = capture.ops[mem.peak_op]
        where = f"{op.source}  {op.source.code}" if op.source is not None else "(no source line)"
        console.print(
            f"  peak reached     after op {op.index} ({op.name}, {op.phase}, module "
            f"{module_label(op.module)}) at {where}",
            markup=False,
            soft_wrap=True,
        )
    console.print(
        "levers memory cannot predict this script's peak on another GPU without running it there: "
        "the prediction (and the what-ifs and --fit) builds the workload under fake tensors, "
        "which needs a factory; wrap the model, optimizer and step in one (levers memory "
        "path/to/file.py:factory --gpu GPU, see README 'Workloads')",
        markup=False,
        soft_wrap=True,
    )
    return ran.exit_code
