"""The command line of one run of ``levers tune -- python train.py``: a private entry point
the tune search starts once per side (``python -m levers.cli.script_trial --out F [--levers
A,B] ... -- python train.py ...``); the run itself is :mod:`levers.integrations.script_trial`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from levers.integrations.script_trial import SideArgs, run_and_write


def parse(argv: Sequence[str]) -> tuple[SideArgs, list[str]]:
    argv = list(argv)
    if "--" not in argv:
        raise SystemExit("levers.cli.script_trial: give the script after --")
    cut = argv.index("--")
    parser = argparse.ArgumentParser(prog="python -m levers.cli.script_trial")
    parser.add_argument("--out", required=True)
    parser.add_argument("--levers", default="")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--compile-steps", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--probe", action="store_true")
    parser.add_argument("--audit", action="store_true")
    return SideArgs(**vars(parser.parse_args(argv[:cut]))), argv[cut + 1:]


def main(argv: Sequence[str] | None = None) -> int:
    args, words = parse(sys.argv[1:] if argv is None else argv)
    return run_and_write(args, words)


if __name__ == "__main__":
    sys.exit(main())
