"""The ``-- python train.py`` form of ``levers audit`` and ``levers memory``: options and runs.

``levers.cli`` splits the command line at the first ``--``; what follows is the script's command
(``args.script_command``). A verb that takes it calls :func:`add_script_arguments`,
:func:`reject_factory_arguments` and :func:`capture_script`.

What runs a script is imported inside its functions: ``levers --help`` loads this module and
must not import torch (:mod:`levers.cli`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from levers.cli.options import positive_count
from levers.errors import LeversError
from levers.output.atomic import atomic_write_text
from levers.output.console import make_console, say_wrote, silence_stdout
from levers.output.progress import progress_status
from levers.script_defaults import SCRIPT_TIMED, SCRIPT_WARMUP
from levers.units import format_bytes

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
        help="let the script run to its end after the captured step (default: stop it there); "
        "the report is made as soon as the step is captured, before the script goes on",
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


def capture_script(
    args: argparse.Namespace, *, warmup: int, timed: int,
    report: Callable[[ScriptCapture], int],
) -> int:
    """Run the script of ``args.script_command`` and ``report`` its captured step; the exit code
    to end with: the script's own where it is not 0, else the report's.

    The report is made as soon as the step is captured: with ``--keep-running``, before the
    script goes on, so that a script that ends with ``os._exit`` or is killed after the capture
    keeps it; otherwise once levers has stopped the script. A script that fails before a step
    is captured keeps its exit code (its traceback printed as Python prints it) and levers adds
    one line on what it saw; one that fails after the capture keeps its exit code too, a closed
    stdout (``levers audit -- python train.py | head``) included. A script that ends cleanly
    before a step is captured is a usage problem (exit 2): it ran too few steps for the warm-up
    asked for.
    """
    from levers.integrations.script import parse_command, run_script

    if warmup < 1:
        raise LeversError(
            "a script's capture starts at an optimizer step: --warmup must be at least 1"
        )
    if args.tokens_per_step is not None and args.tokens_per_step <= 0:
        raise LeversError(f"--tokens-per-step must be positive, got {args.tokens_per_step}")
    command = parse_command(args.script_command)
    for note in command.notes:
        print(f"levers: note: {note}", file=sys.stderr)
    reported: list[int] = []  # the report's exit code, once made
    with contextlib.ExitStack() as status:
        progress = status.enter_context(progress_status())

        def report_now(capture: Any, workload: Any) -> None:
            status.close()  # the status line ends with the capture, not with the script
            reported.append(report(ScriptCapture(capture, workload)))
            sys.stdout.flush()  # before the script goes on: it may end with os._exit

        run = run_script(
            command,
            warmup=warmup,
            timed=timed,
            keep_running=args.keep_running,
            tokens_per_step=args.tokens_per_step,
            progress=progress.on_ops,
            on_captured=report_now if args.keep_running else None,
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
        above = " (levers' report above was made when the step was captured)" if reported else ""
        print(
            f"levers: {command.display} exited with {run.exit_code} after the captured step{above}",
            file=sys.stderr,
        )
    if not reported:
        try:
            reported.append(report(ScriptCapture(run.capture, run.workload)))
        except BrokenPipeError:
            if run.exit_code == 0:
                raise  # the command line ends quietly with 0
            silence_stdout()  # the script failed: its exit code is the one to keep
    return run.exit_code if run.exit_code != 0 else reported[0]


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


def reject_factory_arguments(args: argparse.Namespace, verb: str) -> None:
    """Refuse, before the script runs, what only a factory's workload takes: a WORKLOAD beside
    the script, and ``--set`` (a script takes its own arguments after --). A verb refuses its own
    such options after this one, each saying what to do instead; none is dropped."""
    if getattr(args, "workload", None) is not None:
        raise LeversError(
            f"levers {verb} got both a workload ({args.workload}) and a script after --; give one"
        )
    if args.set_items:
        raise LeversError(
            "--set sets a factory's parameters; a script takes its own arguments after -- "
            f"(levers {verb} -- python train.py --batch-size 8)"
        )


def warn_nonfinite_loss(capture: Any) -> None:
    """Warn on stderr where the captured step's loss (``settings["loss"]``: what a factory's step
    returned, or what a script passed to ``backward()``) is NaN or infinite. The audit (of a
    factory or a script) and a script's memory report call it before their report."""
    loss = capture.settings.get("loss")
    if loss is not None and not math.isfinite(loss):
        make_console(stderr=True).print(
            f"warning: the step's loss is {loss} in the captured step: the step trains on "
            "nothing useful, and its figures are those of a broken run; fix the loss first",
            markup=False,
            soft_wrap=True,
        )


def run_memory(args: argparse.Namespace, console: Any) -> int:
    """``levers memory -- python train.py``: the captured step's own peak, and what cannot be said.

    The memory model predicts a step by building its workload under fake tensors, which needs a
    factory; a script builds its model as it runs. So for a script levers reports the peak it saw
    in the captured step (the CUDA allocator's on a GPU, tracked tensor storages on a CPU) and
    says that the prediction for another GPU, the what-ifs and ``--fit`` need a factory.
    ``--json FILE`` writes the same report (:func:`script_memory_report`).
    """
    warmup = SCRIPT_WARMUP if args.warmup is None else args.warmup
    if args.json_path is not None:
        from levers.capture.json_io import check_writable

        check_writable(args.json_path, make_parents=True)  # before the script runs

    def report(ran: ScriptCapture) -> int:
        warn_nonfinite_loss(ran.capture)
        data = script_memory_report(ran.capture, warmup)
        _print_memory(data, console)
        if args.json_path is not None:
            atomic_write_text(args.json_path, json.dumps(data, indent=1) + "\n", make_parents=True)
            say_wrote(args.json_path)
        return 0

    return capture_script(args, warmup=warmup, timed=0, report=report)


NO_PREDICTION = (
    "levers memory cannot predict this script's peak on another GPU without running it there: "
    "the prediction (and the what-ifs and --fit) builds the workload under fake tensors, "
    "which needs a factory; wrap the model, optimizer and step in one (levers memory "
    "path/to/file.py:factory --gpu GPU, see README 'Workloads')"
)


def script_memory_report(capture: Any, warmup: int) -> dict[str, Any]:
    """What ``levers memory -- python train.py`` reports, as data (``--json`` writes it)."""
    from levers.audit.summary import module_label

    mem = capture.memory
    peak_op = None
    if mem.peak_op is not None and mem.peak_op < len(capture.ops):
        op = capture.ops[mem.peak_op]
        peak_op = {
            "index": op.index,
            "name": op.name,
            "phase": op.phase,
            "module": module_label(op.module),
            "file": op.source.file if op.source is not None else None,
            "line": op.source.line if op.source is not None else None,
            "code": op.source.code if op.source is not None else None,
        }
    return {
        "schema": "levers.memory-script/1",
        "workload": capture.workload,
        "command": capture.workload_params.get("command"),
        "captured_step": warmup + 1,  # the script's optimizer step, 1-based
        "source": mem.source,  # "cuda-allocator" or "tracked-storages"
        "device_name": capture.env.get("device_name"),
        "peak_bytes": mem.peak_bytes,
        "peak_reserved_bytes": mem.peak_reserved_bytes,
        "start_bytes": mem.start_bytes,
        "end_bytes": mem.end_bytes,
        "peak_op": peak_op,
        "prediction": None,
        "no_prediction": NO_PREDICTION,
    }


def _print_memory(data: dict[str, Any], console: Any) -> None:
    on_gpu = data["source"] == "cuda-allocator"
    how = (
        f"measured by the CUDA caching allocator on {data['device_name']}"
        if on_gpu
        else f"tracked tensor storages on {data['device_name']} (not a GPU prediction)"
    )
    console.print()
    label = "peak allocated" if on_gpu else "peak tracked  "
    lines = [
        f"levers memory {data['workload']}: optimizer step {data['captured_step']} of the "
        f"script, {how}",
        f"  {label}   {format_bytes(data['peak_bytes'])}",
    ]
    if data["peak_reserved_bytes"] is not None:
        lines.append(f"  peak reserved    {format_bytes(data['peak_reserved_bytes'])}")
    for line in lines:
        console.print(line, markup=False, soft_wrap=True)
    console.print(
        f"  at step start    {format_bytes(data['start_bytes'])} (parameters, gradients, optimizer "
        "state and whatever else the script keeps)",
        markup=False,
    )
    op = data["peak_op"]
    if op is not None:
        where = (f"{op['file']}:{op['line']}  {op['code']}" if op["file"] is not None
                 else "(no source line)")
        console.print(
            f"  peak reached     after op {op['index']} ({op['name']}, {op['phase']}, module "
            f"{op['module']}) at {where}",
            markup=False,
            soft_wrap=True,
        )
    console.print(data["no_prediction"], markup=False, soft_wrap=True)
