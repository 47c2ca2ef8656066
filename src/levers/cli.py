"""The ``levers`` command line.

Each verb lives in its own module and plugs in through ``add_parser(subparsers)``, which adds its
sub-parser and sets ``func`` (called with the parsed namespace, returning an exit code). This
module only wires them together and turns :class:`levers.errors.LeversError` into a message and
an exit code, so a user never sees a traceback from inside levers.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# verb modules, each with add_parser(subparsers); a verb whose module is absent is not offered
VERB_MODULES = (
    "levers.report.audit_cli",
    "levers.memory.cli",
    "levers.ab.cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="levers",
        description="Find, fix and prove the speed and memory levers of a PyTorch training step.",
    )
    subparsers = parser.add_subparsers(dest="verb", metavar="VERB")
    for name in VERB_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:  # a verb module that exists but fails to import is a bug
                raise
            continue
        module.add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    from levers.errors import LeversError

    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except LeversError as exc:
        from levers.report.errors import print_error

        print_error(exc)
        return exc.exit_code
    except KeyboardInterrupt:
        print("levers: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
