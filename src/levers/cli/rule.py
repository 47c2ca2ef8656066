"""``levers rule``: a rule's documentation, from its docstring, as ``ruff rule`` prints it.

    levers rule ATTN001           # one rule: its metadata and documentation
    levers rule --all             # docs/rules.md on stdout
    levers rule --all --output docs/rules.md

What runs the verb is imported inside its functions: ``levers --help`` loads this module and
must not import torch (:mod:`levers.cli`).
"""

from __future__ import annotations

import argparse
import sys

from levers.errors import LeversError
from levers.output.atomic import atomic_write_text
from levers.output.console import say_wrote


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "rule",
        help="print an audit rule's documentation",
        description="Print an audit rule's documentation (its code, name, status, default "
        "severity, fix safety and levers, then its docstring), or with --all the whole "
        "docs/rules.md.",
    )
    parser.add_argument("code", nargs="?", help="a rule code, e.g. ATTN001")
    parser.add_argument("--all", action="store_true", help="every rule: the text of docs/rules.md")
    parser.add_argument(
        "--output", metavar="FILE", help="with --all: write the text to FILE (atomically)"
    )
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    from levers.audit.rule_docs import rule_text, rules_markdown
    from levers.audit.rules.registry import all_rules

    if args.all == bool(args.code):
        raise LeversError("give one rule code (levers rule ATTN001) or --all, not both or neither")
    if args.output and not args.all:
        raise LeversError("--output writes the --all text; for one rule redirect stdout instead")
    if args.all:
        text = rules_markdown()
        if args.output:
            atomic_write_text(args.output, text)
            say_wrote(args.output)
        else:
            sys.stdout.write(text)
        return 0
    rules = all_rules()
    code = args.code.strip().upper()
    if code not in rules:
        raise LeversError(f"no rule {args.code!r}; known codes: {', '.join(rules)}")
    sys.stdout.write(rule_text(rules[code]))
    return 0
