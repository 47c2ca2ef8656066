"""``levers memory``: will a training step fit on a GPU, what fills it, and what is the largest
batch that fits? Predicted without a GPU.

    levers memory WORKLOAD [--set KEY=VALUE ...] --gpu GPU [--fit PARAM] [--margin F]
                  [--measure] [--json FILE] [--predict-steps N] [--no-whatifs] [--lever NAME]

What runs the verb is imported inside its functions: ``levers --help`` loads this module and
must not import torch (:mod:`levers.cli`).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, replace
from typing import Any

from levers.errors import LeversError
from levers.cli.options import (
    add_lever_argument,
    WORKLOAD_FORMS,
    add_gpu_argument,
    add_output_arguments,
    add_predict_steps_argument,
    add_set_argument,
    add_warmup_argument,
    add_workload_argument,
    lever_ids,
)
from levers.cli.script import (
    SCRIPT_HELP,
    add_script_arguments,
    reject_factory_arguments,
    reject_script_options,
    run_memory,
)
from levers.output.atomic import atomic_write_text
from levers.memory.steps import DEFAULT_NUM_STEPS
from levers.hardware import DEFAULT_GPU
from levers.output.console import make_console, say_wrote
from levers.output.errors import debug_from_env
from levers.script_defaults import SCRIPT_WARMUP


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "memory",
        help="predict a training step's peak GPU memory without a GPU, and what fills it",
        description=(
            "Run the workload's factory and training steps on fake tensors that stand in for a "
            "GPU (nothing is allocated, so an 8B model runs on a laptop), replay the "
            "allocations through a model of PyTorch's CUDA caching allocator, and print the "
            "predicted max_memory_allocated and max_memory_reserved, what fills the peak and "
            "when it happens."
        ),
        epilog=(
            f"WORKLOAD is {WORKLOAD_FORMS}; the factory gets device=cuda unless --set gives one. "
            "Example: levers memory llama --set size=8b --gpu h100-80gb --fit batch_size"
        ),
    )
    add_workload_argument(parser, help=f"{WORKLOAD_FORMS} (or a script after --: see below)")
    add_set_argument(parser)
    add_gpu_argument(
        parser, what="the GPU the peak is predicted for (the memory it has)", budget=True
    )
    parser.add_argument(
        "--fit",
        nargs="?",
        const="batch_size",
        metavar="PARAM",
        help="find the largest integer PARAM that fits (default PARAM: batch_size)",
    )
    parser.add_argument(
        "--margin",
        type=float,
        default=None,
        metavar="F",
        help="fraction of usable GPU memory to keep free when judging a fit (default: 0.05)",
    )
    parser.add_argument(
        "--measure", action="store_true", help="also run the real step on this GPU and compare"
    )
    add_output_arguments(parser, json="the plan")
    add_predict_steps_argument(parser, default=DEFAULT_NUM_STEPS)
    parser.add_argument(
        "--no-whatifs", dest="whatifs", action="store_false", help="skip the what-ifs"
    )
    add_lever_argument(
        parser,
        help="predict the step with this lever applied (repeatable; compile-blocks and "
        "compile-model are predicted compiled, partitioned as inductor partitions them; float8 "
        "when the --gpu runs float8 matmuls; a lever the prediction cannot apply is named, "
        "with why)",
    )

    add_warmup_argument(parser, default=f"{SCRIPT_WARMUP}; a script after -- only")
    add_script_arguments(parser)
    parser.epilog = f"{parser.epilog} {SCRIPT_HELP}"
    parser.add_argument(
        "--world-size",
        type=int,
        default=None,
        metavar="N",
        help="also predict the peak of each of N data-parallel ranks (with --strategy)",
    )
    parser.add_argument(
        "--strategy",
        choices=("ddp", "zero1", "fsdp2"),
        default=None,
        help="how the N ranks share the model: ddp (replicated, plus DDP's gradient buckets), "
        "zero1 (optimizer state sharded), fsdp2 (parameters, gradients and state sharded, plus "
        "all-gather buffers); default with --world-size: ddp",
    )
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    from levers.api import Step
    from levers.loader import parse_set
    from levers.memory.options import MemoryOptions
    from levers.memory.render import render_plan

    console = make_console()
    if getattr(args, "script_command", None) is not None:
        reject_factory_arguments(args, "memory")
        _reject_prediction_options(args)
        return run_memory(args, console)

    reject_script_options(
        args, "memory", {"--warmup": ("warmup", "a prediction's steps are all predicted alike")}
    )
    if args.workload is None:
        raise LeversError(
            "levers memory needs a WORKLOAD (demo, llama, path/to/file.py:factory) or a script "
            "after -- (levers memory -- python train.py)"
        )
    try:
        options = MemoryOptions.checked(
            gpu=args.gpu or DEFAULT_GPU,
            margin=args.margin,
            num_steps=args.predict_steps,
            whatifs=args.whatifs,
            world_size=args.world_size,
            strategy=args.strategy,
        )
    except ValueError as exc:
        raise LeversError(str(exc)) from None
    if args.json_path is not None:
        from levers.capture.json_io import check_writable

        check_writable(args.json_path, make_parents=True)  # before the prediction, not after
    _check_distributed(args)
    params = parse_set(args.set_items)
    ids = lever_ids(args.levers)
    _check_levers(ids)
    if args.fit and args.fit in params:
        _check_fit_start(args.fit, params[args.fit])
    step = Step(args.workload, params)
    with console.status(f"predicting {args.workload} on {options.gpu.name} (fake tensors)…"):
        try:
            plan = step.memory(lever_ids=ids, options=options)
        except LeversError:
            raise
        except Exception as exc:
            raise prediction_failed(args.workload, exc, debug=_debug(args)) from exc
    if args.fit:
        tried: list[Any] = []  # the fit's points so far (FitPoint), kept if it is interrupted
        try:
            plan = replace(plan, fit=_fit(console, step, args, options, plan.params, ids, tried))
        except KeyboardInterrupt:
            # the prediction is finished: show it and write it rather than lose it with the search
            render_plan(plan, console)
            kept = ""
            if args.json_path is not None:
                data = plan.to_dict()
                data["fit"] = {
                    "param": args.fit,
                    "interrupted": True,
                    "curve": [asdict(point) for point in tried],  # in the order tried
                }
                _write_plan(args.json_path, data)
                say_wrote(args.json_path)
                kept = f" ({args.json_path} holds it and the {len(tried)} value(s) tried)"
            make_console(stderr=True).print(
                f"the --fit search was interrupted; the prediction above is complete, without "
                f"the largest {args.fit} that fits{kept}",
                markup=False,
                soft_wrap=True,
            )
            raise
    if args.measure:
        with console.status("measuring the real step on the GPU…"):
            plan = replace(
                plan, measured=step.measure_memory(num_steps=options.num_steps, lever_ids=ids)
            )
    render_plan(plan, console)
    if "per_rank" in plan.extra:
        from levers.memory.render import render_per_rank

        render_per_rank(plan.extra["per_rank"], plan, console)
    if args.json_path is not None:
        _write_plan(args.json_path, plan.to_dict())
        say_wrote(args.json_path)
    return 0


def _write_plan(path: str, data: dict[str, Any]) -> None:
    try:
        atomic_write_text(path, json.dumps(data, indent=1, default=str), make_parents=True)
    except OSError as exc:
        raise LeversError(
            f"cannot write {path}: {exc.strerror or exc}; choose another path (the plan is "
            "printed above)"
        ) from None


def _check_distributed(args: argparse.Namespace) -> None:
    """The options the per-rank prediction cannot take beside it (the ranks and their strategy
    themselves are checked by the record)."""
    if args.world_size is not None and (args.fit or args.measure or args.levers):
        raise LeversError(
            "--world-size predicts one rank of N from the single-rank step; run --fit, "
            "--measure and --lever without it"
        )


def prediction_failed(label: str, exc: BaseException, *, debug: bool) -> LeversError:
    """One line for a step that fake tensors could not run; torch's log and the traceback only
    under ``--debug``. A failure the workload can fix says how, and asks for no bug report."""
    from levers.memory.fake_failures import failure_detail, first_line, user_fix

    fix = user_fix(exc)
    message = f"predicting {label} on fake tensors failed: {first_line(exc)}. "
    if fix is not None:
        message += f"To predict it, {fix}"
    else:
        message += (
            "If the step works on a GPU, the step does something fake tensors cannot run; "
            "please report it with the workload"
            + (" and the detail below" if debug else " and the detail that --debug prints")
        )
    return LeversError(message, user_traceback=failure_detail(exc) if debug else None)


def _debug(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "debug", False)) or debug_from_env()


def _reject_prediction_options(args: argparse.Namespace) -> None:
    """Options that ask for a prediction, or change the workload, which a script cannot give:
    refuse them, do not ignore them (a script's peak is measured as it runs)."""
    predicted = [
        flag for flag, given in (
            ("--fit", args.fit), ("--gpu", args.gpu), ("--margin", args.margin is not None),
            ("--predict-steps (--steps)", args.predict_steps is not None),
            ("--world-size", args.world_size is not None), ("--strategy", args.strategy),
        ) if given
    ]
    if predicted:
        named = " and ".join(predicted)
        raise LeversError(
            f"{named} {'needs' if len(predicted) == 1 else 'need'} a prediction on fake "
            "tensors, which builds the workload from a factory; a script after -- is measured "
            "as it runs, on this machine. Wrap the model, optimizer and step in a factory and "
            "run levers memory path/to/file.py:factory --gpu GPU --fit batch_size (see README "
            f"'Workloads'), or drop {named}"
        )
    if args.levers:
        stack = ",".join(lever_ids(args.levers))
        raise LeversError(
            f"--lever {stack}: levers memory applies a lever to a factory's workload before its "
            "prediction; a script builds its own model. Apply it in the script (with "
            f'levers.apply(model, "{stack}", optimizer=optimizer): around the loop) and run '
            "levers memory -- python ... again to measure the step with it, or predict it from "
            f"a factory (levers memory path/to/file.py:factory --lever {stack})"
        )


def _fit(
    console, step, args, options, params: dict[str, Any], ids: list[str], tried: list[Any]
):
    """The fit's search; each point predicted is appended to ``tried`` as it comes."""
    start = params.get(args.fit)
    if start is not None:
        _check_fit_start(args.fit, start)
    with console.status(f"searching {args.fit}…") as status:

        def progress(point) -> None:
            tried.append(point)
            status.update(
                f"searching {args.fit}: {args.fit}={point.value} "
                f"{'fits' if point.fits else 'does not fit'}…"
            )

        return step.fit(
            args.fit, start=start, progress=progress, lever_ids=ids, options=options
        )


def _check_levers(ids: list[str]) -> None:
    """Refuse an unknown lever or option before the prediction."""
    if not ids:
        return
    from levers.levers.handle import find_specs

    try:
        find_specs(ids)
    except (ValueError, KeyError) as exc:
        raise LeversError(f"--lever: {exc}") from None


def _check_fit_start(param: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise LeversError(
            f"--fit {param}: the workload's {param} is {value!r}, not a positive integer; "
            "fit an integer parameter such as batch_size"
        )
