"""``levers audit --no-measure``: the flag reaches ``Step.audit`` as ``measure=False``."""

from __future__ import annotations

import argparse
from types import SimpleNamespace

from levers.cli import audit_findings as cli_findings
from levers.cli import build_parser


class _Step:
    """Records what the audit CLI asks of ``Step.audit`` and stops there."""

    def __init__(self) -> None:
        self.options: dict = {}

    def audit(self, **options):
        self.options = options
        raise _Stop


class _Stop(Exception):
    pass


def _asked(argv: list[str]) -> dict:
    args = build_parser().parse_args(argv)
    step = _Step()
    try:
        cli_findings.run_findings(args, capture=None, workload=None, console=None, step=step)
    except _Stop:
        pass
    return step.options


def test_no_measure_parses_and_maps_to_measure_false():
    args = build_parser().parse_args(["audit", "demo", "--no-measure"])
    assert args.no_measure is True
    assert _asked(["audit", "demo", "--no-measure"])["measure"] is False


def test_without_the_flag_the_step_decides():
    assert _asked(["audit", "demo"])["measure"] is None
