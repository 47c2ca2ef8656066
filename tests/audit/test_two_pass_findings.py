"""The audit finds the same on a two-pass capture as on a one-pass capture of the same step.

(The rules' golden files, made from one-pass captures, hold every fixture case to this already:
their captures are two-pass now. This test holds the built-in workloads to it.)
"""

from __future__ import annotations

import dataclasses
import importlib

import pytest

from audit_helpers import BASE_CONFIG, printed, rule_config
from levers.audit.options import AuditOptions
from levers.audit.config import make_config
from levers.audit.cost.price import price
from levers.audit.peak_metric_source import function_scope
from levers.audit.rules.registry import all_rules
from levers.capture import capture_step


def _findings(name: str, params: dict, mode: str) -> str:
    workload = importlib.import_module(f"levers.workloads.{name}").build(**params)
    capture = capture_step(workload, warmup=1, timed=2, mode=mode)
    key, scope = function_scope(workload.step)
    config = rule_config(capture, {key: scope}, **BASE_CONFIG)
    findings = [f for rule in all_rules().values() for f in rule.check(capture, config)]
    return printed(price(findings, capture, dataclasses.replace(config, on_gpu=False)))


@pytest.mark.parametrize(
    "name, params",
    [("demo", {}), ("llama", {}), ("hf", {"arch": "llama", "attn": "sdpa", "size": "tiny"})],
)
def test_both_modes_give_the_same_findings(name, params):
    if name == "hf":
        pytest.importorskip("transformers")
    one = _findings(name, params, "one-pass")
    assert one != "(no findings)\n"
    assert _findings(name, params, "two-pass") == one
