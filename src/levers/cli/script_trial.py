"""The command line of one run of ``levers tune -- python train.py``: a private entry point
the tune search starts once per side (``python -m levers.cli.script_trial --out F [--levers
A,B] ... -- python train.py ...``); the run itself is :mod:`levers.integrations.script_trial`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from levers.cli.options import add_steps_argument, add_warmup_argument
from levers.integrations.script_trial import SideArgs, run_and_write


def parse(argv: Sequence[str]) -> tuple[SideArgs, list[str]]:
    argv = list(argv)
    if "--" not in argv:
        raise SystemExit("levers.cli.script_trial: give the script after --")
    cut = argv.index("--")
    parser = argparse.ArgumentParser(prog="python -m levers.cli.script_trial")
    parser.add_argument("--out", required=True)
    parser.add_argument("--levers", default="")
    add_warmup_argument(parser, default=str(SideArgs.warmup))
    parser.add_argument("--compile-steps", type=int, default=SideArgs.compile_steps)
    add_steps_argument(parser, default=str(SideArgs.steps))
    parser.add_argument("--probe", action="store_true")
    parser.add_argument("--audit", action="store_true")
    given = {k: v for k, v in vars(parser.parse_args(argv[:cut])).items() if v is not None}
    return SideArgs(**given), argv[cut + 1:]


def main(argv: Sequence[str] | None = None) -> int:
    args, words = parse(sys.argv[1:] if argv is None else argv)
    return run_and_write(args, words)


if __name__ == "__main__":
    sys.exit(main())
