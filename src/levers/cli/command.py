"""The ``levers`` command line.

Each verb lives in its own module and plugs in through ``add_parser(subparsers)``, which adds its
sub-parser and sets ``func`` (called with the parsed namespace, returning an exit code). This
module only wires them together and turns errors into messages and exit codes:

- 0: success; 1: ``levers audit --fail-on`` found what it gates on; 2: a
  :class:`levers.errors.LeversError` from the input (or a usage error); 3: the workload's code
  raised (:class:`levers.errors.StepError`), called ``sys.exit()`` or raised a
  ``BaseException`` that is not an ``Exception``; 70: a defect in levers itself; 130:
  interrupted.

Errors are rendered by :mod:`levers.output.errors` for every verb.

A user never sees a traceback from inside levers unless they ask for it with ``--debug`` (before
or after the verb) or ``LEVERS_DEBUG=1``.

The workload loader is imported when a verb runs: ``levers --help`` loads this module and
does without it (:mod:`levers.cli`).
"""

from __future__ import annotations

import argparse
import errno
import importlib
import sys

from levers.errors import LeversError, StepError
from levers.output.console import silence_stdout
from levers.output.errors import debug_from_env, print_error, print_internal_error

# verb modules, each with add_parser(subparsers); a verb whose module is absent is not offered
VERB_MODULES = (
    "levers.cli.audit",
    "levers.cli.rule",
    "levers.cli.memory",
    "levers.cli.ab",
    "levers.cli.compare",
    "levers.cli.prereg",
    "levers.cli.list",
    "levers.cli.tune",
)

# 70 (EX_SOFTWARE): 1 is `levers audit --fail-on`'s "findings remain", which a CI gate reads
EXIT_INTERNAL_ERROR = 70
EXIT_INTERRUPTED = 130
EXIT_USAGE = 2
# write errors that say the machine is out of room, not that levers is wrong
_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)

_DEBUG_HELP = "show the full traceback of an internal error (also LEVERS_DEBUG=1)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="levers",
        description="Find, fix and prove the speed and memory levers of a PyTorch training step.",
    )
    parser.add_argument("--debug", action="store_true", help=_DEBUG_HELP)
    subparsers = parser.add_subparsers(dest="verb", metavar="VERB")
    for name in VERB_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if not (name == exc.name or name.startswith(f"{exc.name}.")):
                raise  # a verb module that exists but fails to import is a bug
            continue
        module.add_parser(subparsers)
    for subparser in subparsers.choices.values():
        _add_debug_flag(subparser)
    return parser


def _add_debug_flag(subparser: argparse.ArgumentParser) -> None:
    # SUPPRESS keeps a verb's parser from overwriting a --debug given before the verb
    try:
        subparser.add_argument(
            "--debug", action="store_true", default=argparse.SUPPRESS, help=_DEBUG_HELP
        )
    except argparse.ArgumentError:
        pass  # the verb defines its own --debug


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    debug = _debug_requested(argv)
    try:
        parser = build_parser()
        argv, script_command = _split_script_command(argv)
        args = parser.parse_args(argv)
        args.script_command = script_command
        debug = debug or bool(getattr(args, "debug", False))
        if getattr(args, "func", None) is None:
            parser.print_help()
            return 2
        if script_command is not None and not getattr(args, "takes_script", False):
            parser.error(f"levers {args.verb} does not take a script after --")
        if script_command is not None:
            # a script keeps its own argv and exit code: the script runner handles both
            return int(args.func(args) or 0)
        return _run_verb(args)
    except LeversError as exc:
        print_error(exc)
        return exc.exit_code
    except KeyboardInterrupt:
        print("levers: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # the reader went away (levers audit | head); nothing left to say to it
        silence_stdout()
        return 0
    except OSError as exc:
        if exc.errno not in _FULL:
            print_internal_error(exc, debug=debug)
            return EXIT_INTERNAL_ERROR
        # a full disk (levers audit > /dev/full): the machine's state, not a defect in levers
        silence_stdout()
        where = f" {exc.filename}" if exc.filename else " (standard output)"
        print(f"levers: cannot write{where}: {exc.strerror}; free some space or write elsewhere",
              file=sys.stderr)
        return EXIT_USAGE
    except Exception as exc:  # noqa: BLE001 - a defect in levers: short note, traceback on request
        print_internal_error(exc, debug=debug)
        return EXIT_INTERNAL_ERROR
    except BaseException as exc:  # noqa: BLE001 - not an Exception: only user code raises these
        if isinstance(exc, (SystemExit, GeneratorExit)):
            raise  # SystemExit here is argparse's own usage error, before the verb ran
        return _workload_left(
            f"the workload's code raised {type(exc).__name__}: {exc} (a BaseException that is "
            "not an Exception); stop the step by returning or raising an Exception instead"
        )


def _run_verb(args: argparse.Namespace) -> int:
    """The verb, with the workload's code seeing the argv of ``python its_file.py``."""
    from levers.loader import workload_argv

    try:
        with workload_argv(_workload_spec(args)):
            return int(args.func(args) or 0)
    except SystemExit as exc:  # levers' own usage errors are raised by parse_args, not here
        code = "" if exc.code is None else repr(exc.code)
        return _workload_left(
            f"the workload's code called sys.exit({code}); a factory or step must return, not "
            "exit. If it parses command-line arguments, it gets none under levers: give its "
            "options defaults or make them factory parameters (--set KEY=VALUE)"
        )


def _workload_spec(args: argparse.Namespace) -> str | None:
    return getattr(args, "workload", None) or getattr(args, "baseline", None)


def _workload_left(message: str) -> int:
    """The workload left levers by a side door (sys.exit, a BaseException): one line, exit 3."""
    error = StepError(message)
    print_error(error)
    return error.exit_code


def _split_script_command(argv: list[str]) -> tuple[list[str], list[str] | None]:
    """levers' own arguments, and the script command after the first ``--`` (or None)."""
    if "--" not in argv:
        return argv, None
    cut = argv.index("--")
    return argv[:cut], argv[cut + 1 :]


def _debug_requested(argv: list[str]) -> bool:
    return debug_from_env() or "--debug" in argv


if __name__ == "__main__":
    sys.exit(main())
