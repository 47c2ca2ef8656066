"""levers.audit.already_right: each rule owns its checks; the collector lists them in order."""

from __future__ import annotations

import ast
from pathlib import Path

from levers.audit.options import AuditOptions
import levers.audit.already_right as collector
from levers.audit.already_right import ORDER, already_right, rule_checks
from levers.audit.config import make_config
from levers.audit.finding import AlreadyRight
from levers.audit.rules.registry import all_rules

SETTINGS = {"activation_checkpointing": True, "cuda_alloc_conf": "expandable_segments:True"}
ALL = tuple(all_rules())


def test_each_check_is_defined_in_its_rules_module():
    rules = all_rules()
    pairs = rule_checks()
    assert {code for code, _ in pairs} == set(ORDER)
    for code, check in pairs:
        assert check.__module__ == rules[code].module, (code, check.__name__)


def test_the_collector_reads_no_rules_internals():
    tree = ast.parse(Path(collector.__file__).read_text())
    imported = {
        node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
    } | {
        alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
        for alias in node.names
    }
    rule_modules = {m for m in imported if m.startswith("levers.audit.rules.")}
    assert rule_modules == {"levers.audit.rules.registry"}


def test_items_of_active_rules_that_did_not_fire_in_the_reports_order(build_capture):
    capture = build_capture(settings=SETTINGS)
    config = make_config(capture, AuditOptions.checked(gpu="h100"))
    # the hand capture: three SDPA calls, no fused norm, real syncs, a loss with ignored rows
    assert already_right(capture, config, fired=(), active=ALL) == [
        AlreadyRight(
            "ATTN002",
            "attention through SDPA",
            "3 scaled_dot_product_attention calls; no materialised score matrices",
        ),
        AlreadyRight("MEM001", "activation checkpointing on", "0 ops recomputed in backward"),
        AlreadyRight(
            "COPY001",
            "no needless copies",
            "no clone-then-scatter and no user-level copy over 64 MiB in the forward pass",
        ),
        AlreadyRight(
            None, "expandable_segments set", "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
        ),
    ]


def test_a_fired_or_unselected_rule_lists_nothing_and_the_allocator_item_stays(build_capture):
    capture = build_capture(settings=SETTINGS)
    config = make_config(capture, AuditOptions.checked(gpu="h100"))
    fired = already_right(capture, config, fired=("ATTN002",), active=ALL)
    assert [item.code for item in fired] == ["MEM001", "COPY001", None]
    selected = already_right(capture, config, fired=(), active=("COPY001",))
    assert [item.code for item in selected] == ["COPY001", None]
