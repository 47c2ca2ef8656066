"""Shared helpers of the detector tests: capture a fixture case, run one rule, print, compare.

A rule's fixtures live in ``tests/audit/rules/<CODE>/cases.py``: factories named ``fire_*`` (the
rule must fire, with a receipt on the line marked ``# mark: <case name> [<case name>...]``), ``ok_*`` (it must not
fire) and ``regress_*`` (behaviour pinned by the golden file). ``CONFIG`` in that module maps a
case name to ``make_config`` keywords (target, torch_version, assume_dtype); ``TRANSFORM`` maps a
case name to a function applied to its capture (to emulate a GPU capture on a CPU).

The printed findings of every case are compared as text with ``<CODE>/golden.txt``. After an
intended change, regenerate with ``LEVERS_UPDATE_GOLDENS=1 pytest tests/audit/rules`` and review
the diff.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import os
from pathlib import Path

from rich.console import Console

from levers.audit.options import AuditOptions
from levers.capture import capture_step
from levers.capture.records import Capture
from levers.audit.config import make_config
from levers.audit.cost.price import price
from levers.audit.finding import Finding
from levers.audit.peak_metric_source import function_scope
from levers.audit.rules.registry import all_rules
from levers.loader import load_workload
from levers.audit.render_terminal import _finding_text

HERE = Path(__file__).parent / "rules"  # one folder per rule code: cases.py, golden.txt
# rules are checked against torch 2.11's SDPA dispatch on an H100 unless a case says otherwise
BASE_CONFIG = {"target": "h100", "torch_version": "2.11"}


def rule_config(capture: Capture, scopes=None, **given):
    """make_config for a test: ``given`` holds AuditOptions' values (``target`` for its ``gpu``,
    as the cases' CONFIG dicts name it) and ``memory``, the memory model's prediction."""
    memory = given.pop("memory", None)
    if "target" in given:
        given["gpu"] = given.pop("target")
    return make_config(capture, AuditOptions.checked(**given), scopes=scopes, memory=memory)


def cases_module(code: str):
    path = HERE / code / "cases.py"
    spec = importlib.util.spec_from_file_location(
        f"detector_cases_{code.lower()}", path
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def case_names(code: str) -> list[str]:
    module = cases_module(code)
    return sorted(n for n in dir(module) if n.startswith(("fire_", "ok_", "regress_")))


def mark_line(code: str, name: str) -> int:
    lines = (HERE / code / "cases.py").read_text().splitlines()
    hits = [
        i + 1
        for i, line in enumerate(lines)
        if "# mark: " in line and name in line.split("# mark: ", 1)[1].split()
    ]
    assert len(hits) == 1, f"mark {name!r} found {len(hits)} times in {code}/cases.py"
    return hits[0]


@functools.cache
def captured(code: str, name: str) -> tuple[Capture, dict]:
    """The capture of one case (after one warm-up step) and the scopes of its step function.
    What a case sets for the process (a lever it leaves on: compile-blocks unspecialises int
    attributes) is put back after its capture, so no case depends on which ran before it."""
    from levers.memory.prediction import compile_settings_kept

    with compile_settings_kept():
        workload = load_workload(f"{HERE / code / 'cases.py'}:{name}", {})
        capture = capture_step(workload, warmup=1, timed=0)
    transform = getattr(cases_module(code), "TRANSFORM", {}).get(name)
    if transform is not None:
        capture = transform(capture)
    key, scope = function_scope(workload.step)
    return capture, {key: scope}


def run_rule(code: str, name: str) -> list[Finding]:
    """The findings of rule ``code`` on case ``name``, priced (estimated for the target GPU)."""
    capture, scopes = captured(code, name)
    kwargs = {**BASE_CONFIG, **getattr(cases_module(code), "CONFIG", {}).get(name, {})}
    config = rule_config(capture, scopes, **kwargs)
    findings = list(all_rules()[code].check(capture, config))
    # costs in goldens are always the roofline estimate: a relabelled CPU capture has no device time
    return price(findings, capture, dataclasses.replace(config, on_gpu=False))


def printed(findings: list[Finding]) -> str:
    with open(os.devnull, "w") as sink:
        console = Console(
            width=110, record=True, color_system=None, file=sink, highlight=False
        )
        if not findings:
            console.print("(no findings)")
        for rank, finding in enumerate(findings, start=1):
            console.print(_finding_text(rank, finding, lambda p: Path(p).name))
        text = console.export_text()
    return "\n".join(line.rstrip() for line in text.splitlines()) + "\n"


def golden_text(code: str) -> str:
    parts = []
    for name in case_names(code):
        parts.append(f"## {name}\n")
        parts.append(printed(run_rule(code, name)))
    return "\n".join(parts)


def check_golden(code: str) -> None:
    path = HERE / code / "golden.txt"
    text = golden_text(code)
    if os.environ.get("LEVERS_UPDATE_GOLDENS") == "1":
        path.write_text(text)
    assert path.exists(), (
        f"{path} is missing; write it with LEVERS_UPDATE_GOLDENS=1 and review it"
    )
    expected = path.read_text()
    assert text == expected, (
        f"{code} findings differ from {path}; review, then LEVERS_UPDATE_GOLDENS=1"
    )


def relabel_as_gpu(capture: Capture) -> Capture:
    """The capture as if it had run on an H100 (for GPU-only rules' CPU fixtures)."""
    env = {**capture.env, "device": "cuda:0", "device_name": "NVIDIA H100 80GB HBM3"}
    return dataclasses.replace(capture, env=env)
