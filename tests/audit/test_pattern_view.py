"""levers.audit.pattern_view: each pattern finder runs once per audit, whoever reads it."""

from __future__ import annotations

import dataclasses
import gc
import sys
from collections import Counter

import pytest

from levers.audit.options import AuditOptions
from levers.audit import pattern_view as view_module
from levers.audit.pattern_view import pattern_view
from levers.audit.patterns import backward_index
from levers.audit.patterns_attention import find_eager_attention
from levers.audit.patterns_fusion import find_gated_activations, find_unfused_rope
from levers.audit.patterns_norm import find_unfused_norms
from levers.audit.run import audit_step
from levers.capture import capture_step
from levers.loader import load_workload

FINDERS = {
    f.__code__: f.__name__
    for f in (
        backward_index,
        find_eager_attention,
        find_unfused_norms,
        find_gated_activations,
        find_unfused_rope,
    )
}


@pytest.fixture(scope="module")
def demo():
    workload = load_workload("demo", {})
    return workload, capture_step(workload, warmup=1, timed=0)


def finder_calls(run) -> Counter:
    """How many times each finder ran during ``run()``, however it was reached (by code object,
    so a reader that imported a finder under another name is counted too)."""
    calls: Counter = Counter()

    def profile(frame, event, arg):
        if event == "call" and frame.f_code in FINDERS:
            calls[FINDERS[frame.f_code]] += 1

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return calls


def audit(workload, capture):
    options = AuditOptions.checked(
        gpu="h100", torch_version="2.11", benchmark=False, memory_model=False
    )
    return audit_step(capture, options, workload=workload)


def test_each_finder_runs_once_in_an_audit_of_the_demo(demo):
    workload, captured = demo
    capture = dataclasses.replace(captured)  # a capture no earlier test has audited
    audited = None

    def run():
        nonlocal audited
        audited = audit(workload, capture)

    calls = finder_calls(run)
    # the demo's attention and norm chains are read by ATTN002/NORM001, COPY002 and the
    # bottleneck; the backward index by eight rules and the bottleneck
    assert calls == {name: 1 for name in FINDERS.values()}
    assert {"ATTN002", "NORM001"} <= {f.code for f in audited.findings}
    assert audited.result.bottleneck.of("attention").num_ops > 0


def test_a_second_audit_of_the_same_capture_finds_nothing_again(demo):
    workload, captured = demo
    capture = dataclasses.replace(captured)
    first = finder_calls(lambda: audit(workload, capture))
    again = finder_calls(lambda: audit(workload, capture))
    assert sum(first.values()) == len(FINDERS)
    assert again == Counter()


def test_the_view_holds_what_the_finders_find(demo):
    _, capture = demo
    view = pattern_view(capture)
    assert view is pattern_view(capture)
    assert view.eager_attention == tuple(find_eager_attention(capture))
    assert view.unfused_norms == tuple(find_unfused_norms(capture))
    assert view.gated_activations == tuple(find_gated_activations(capture))
    assert view.unfused_rope == tuple(find_unfused_rope(capture))
    assert dict(view.backward) == {
        i: tuple(b) for i, b in backward_index(capture).items()
    }
    assert view.eager_attention and view.unfused_norms  # the demo plants both


def test_a_view_goes_with_its_capture(demo):
    _, captured = demo
    capture = dataclasses.replace(captured)
    key = id(capture)
    pattern_view(capture).eager_attention
    assert key in view_module._VIEWS
    del capture
    gc.collect()
    assert key not in view_module._VIEWS
