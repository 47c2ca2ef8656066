"""The audit on the built-in workloads: the demo's eight planted inefficiencies, the fixed demo,
the clean llama control and Hugging Face models built from configs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from levers.audit.options import AuditOptions
import levers.workloads
from levers.capture import capture_step
from levers.audit import audit
from levers.audit.peak_metric_source import function_scope
from levers.loader import load_workload
from levers.workloads.demo_config import FLAGS

WORKLOADS_DIR = Path(levers.workloads.__file__).parent
FLAG_CODES = {
    "suffix_attn": "ATTN001",
    "vit_attn": "ATTN002",
    "norm": "NORM001",
    "checkpointing": "MEM001",
    "loss": "LOSS001",
    "syncs": "SYNC001",
    "clone": "COPY001",
    "peak_metric": "MEM002",
}
MARKER = re.compile(r"^\s*# \[demo:(\w+)\]")


def planted_sites() -> dict[str, set[tuple[str, int]]]:
    """flag -> (file, line) of the code line after each ``# [demo:<flag>]`` comment."""
    sites: dict[str, set[tuple[str, int]]] = {flag: set() for flag in FLAGS}
    for path in sorted(WORKLOADS_DIR.glob("demo*.py")):
        lines = path.read_text().splitlines()
        for i, text in enumerate(lines):
            match = MARKER.match(text)
            if match is None:
                continue
            j = i + 1
            while lines[j].lstrip().startswith("#"):
                j += 1
            sites[match.group(1)].add((str(path), j + 1))
    return sites


def run_audit(spec: str, **params):
    workload = load_workload(spec, params)
    capture = capture_step(workload, warmup=1, timed=0)
    key, scope = function_scope(workload.step)
    options = AuditOptions.checked(gpu="h100", torch_version="2.11")
    return audit(capture, options, scopes={key: scope})


@pytest.fixture(scope="module")
def demo():
    return run_audit("demo")


@pytest.fixture(scope="module")
def demo_fixed():
    return run_audit("demo", fixed="all")


def test_every_flag_has_a_marked_site():
    sites = planted_sites()
    assert set(sites) == set(FLAG_CODES) == set(FLAGS)
    assert all(sites[flag] for flag in FLAGS)


@pytest.mark.parametrize("flag", FLAGS)
def test_demo_reports_each_planted_inefficiency_at_its_line(demo, flag):
    code = FLAG_CODES[flag]
    receipts = {
        (str(Path(r.file).resolve()), line)
        for f in demo.findings
        if f.code == code
        for r in f.receipts
        for line in range(r.line, (r.end_line or r.line) + 1)
    }
    for path, line in planted_sites()[flag]:
        assert (str(Path(path).resolve()), line) in receipts, (
            f"{code} has no receipt at {path}:{line}"
        )


def test_demo_findings_are_priced_and_estimated(demo):
    for f in demo.findings:
        assert f.cost is not None
        assert f.cost.provenance in ("estimated", "none")


def test_fixed_demo_reports_none_and_lists_them_as_already_right(demo_fixed):
    codes = {f.code for f in demo_fixed.findings}
    assert codes.isdisjoint(FLAG_CODES.values()), codes
    right = {item.code for item in demo_fixed.already_right}
    assert set(FLAG_CODES.values()) <= right


@pytest.mark.parametrize("flag", ["suffix_attn", "norm", "clone", "peak_metric"])
def test_fixing_one_flag_removes_its_finding_only(flag):
    result = run_audit("demo", fixed=flag)
    codes = {f.code for f in result.findings}
    assert FLAG_CODES[flag] not in codes
    assert {FLAG_CODES[f] for f in FLAGS if f != flag} <= codes


def test_llama_control_is_clean():
    result = run_audit("llama")
    prefixes = ("ATTN", "NORM", "SYNC", "COPY", "LOSS")
    assert [f.code for f in result.findings if f.code.startswith(prefixes)] == []


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_hf_eager_attention_and_hand_rolled_norm(arch):
    pytest.importorskip("transformers")
    eager = {f.code: f for f in run_audit("hf", arch=arch, attn="eager").findings}
    sdpa = {f.code for f in run_audit("hf", arch=arch, attn="sdpa").findings}
    assert (
        "ATTN002" in eager
        and eager["ATTN002"].receipt.module == "model.layers.*.self_attn"
    )
    assert "ATTN002" not in sdpa
    assert "NORM001" in eager and "NORM001" in sdpa
    assert eager["NORM001"].receipt.file.endswith(f"modeling_{arch}.py")
