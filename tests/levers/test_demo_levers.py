"""Each lever on the live demo model reproduces the demo's own fix (``fixed=<flag>``)."""

from __future__ import annotations

import pytest

import levers
from levers.workloads import demo

from lever_parity import assert_bitwise, assert_close, assert_restored, run_steps, state_of

# lever -> the demo flag it fixes, and whether the two must agree bitwise in fp32 on a CPU
EXACT_ON_CPU = {
    "sdpa-cudnn-backend": "suffix_attn",  # backends do not change a CPU result
    "sdpa-attention": "vit_attn",  # the same SDPA path as the fix
    "inplace-scatter": "clone",
    "windowed-peak-metric": "peak_metric",
}
WITHIN_TOLERANCE = {"rms-norm-fused": "norm", "loss-valid-rows": "loss"}


@pytest.mark.parametrize("lever_id,flag", sorted(EXACT_ON_CPU.items()))
def test_lever_reproduces_the_demo_fix_bitwise(lever_id, flag):
    with_lever = demo.build()
    levers.apply(with_lever, lever_id)
    assert_bitwise(run_steps(with_lever), run_steps(demo.build(fixed=flag)))


@pytest.mark.parametrize("lever_id,flag", sorted(WITHIN_TOLERANCE.items()))
def test_lever_reproduces_the_demo_fix_within_tolerance(lever_id, flag):
    with_lever = demo.build()
    handle = levers.apply(with_lever, lever_id)
    tolerance = levers.levers.REGISTRY[lever_id].tolerance
    assert handle.applied == [lever_id]
    assert_close(run_steps(with_lever), run_steps(demo.build(fixed=flag)), tolerance)
    # and the unfixed demo agrees with both within the same tolerance
    assert_close(run_steps(demo.build()), run_steps(demo.build(fixed=flag)), tolerance)


def test_several_levers_at_once_match_the_demo_fixes():
    with_levers = demo.build()
    handle = levers.apply(with_levers, ",".join(EXACT_ON_CPU))
    assert handle.applied == list(EXACT_ON_CPU)
    fixed = demo.build(fixed=",".join(EXACT_ON_CPU.values()))
    assert_bitwise(run_steps(with_levers, 3), run_steps(fixed, 3))


@pytest.mark.parametrize("lever_id", sorted({**EXACT_ON_CPU, **WITHIN_TOLERANCE}))
def test_undo_restores_the_demo_exactly(lever_id):
    workload = demo.build()
    before = state_of(workload.model)
    step_before = workload.step
    with levers.apply(workload, lever_id) as handle:
        assert handle.applied == [lever_id]
    assert workload.step is step_before
    assert_restored(workload.model, before)
    assert_bitwise(run_steps(workload), run_steps(demo.build()))


def test_demo_fixes_switch_is_flipped_on_the_live_model_and_back():
    workload = demo.build()
    handle = levers.apply(workload, "loss-valid-rows,inplace-scatter")
    assert workload.model.fixes.loss and workload.model.fixes.clone
    handle.undo()
    assert not workload.model.fixes.loss and not workload.model.fixes.clone
