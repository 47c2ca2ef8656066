"""The command line of one run of ``levers tune -- python train.py``: a private entry point the
tune search starts once per A/B (``python -m levers.cli.script_trial --out F [--candidate A,B]
[--baseline A] ... -- python train.py ...``); the run itself is
:mod:`levers.integrations.script_trial`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from levers.cli.options import add_steps_argument, add_warmup_argument
from levers.integrations.script_trial import DRAWS_RANDOM, TrialArgs, run_and_write


def parse(argv: Sequence[str]) -> tuple[TrialArgs, list[str]]:
    argv = list(argv)
    if "--" not in argv:
        raise SystemExit("levers.cli.script_trial: give the script after --")
    cut = argv.index("--")
    parser = argparse.ArgumentParser(prog="python -m levers.cli.script_trial")
    parser.add_argument("--out", required=True)
    parser.add_argument("--candidate", default="", help="the candidate's levers, A,B")
    parser.add_argument("--baseline", default="", help="the baseline's levers (an increment's)")
    add_warmup_argument(parser, default=str(TrialArgs.warmup))
    parser.add_argument("--parity-steps", type=int, default=TrialArgs.parity_steps)
    parser.add_argument("--compile-steps", type=int, default=TrialArgs.compile_steps,
                        help="untimed steps at the start of each window")
    add_steps_argument(parser, default=str(TrialArgs.steps))
    parser.add_argument("--rounds", type=int, default=TrialArgs.rounds,
                        help="pairs of windows, candidate then baseline; 0: the parity steps alone")
    parser.add_argument("--draws-random", choices=sorted(DRAWS_RANDOM),
                        help="whether the model's forward draws random numbers (not said: assumed)")
    parser.add_argument("--probe", action="store_true")
    parser.add_argument("--audit", action="store_true")
    given = {k: v for k, v in vars(parser.parse_args(argv[:cut])).items() if v is not None}
    return TrialArgs(**given), argv[cut + 1:]


def main(argv: Sequence[str] | None = None) -> int:
    args, words = parse(sys.argv[1:] if argv is None else argv)
    return run_and_write(args, words)


if __name__ == "__main__":
    sys.exit(main())
