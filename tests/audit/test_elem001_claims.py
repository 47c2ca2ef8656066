"""ELEM001 counts only the kernels no more specific finding reports, and states its time as the
op-class table accounts for it (defect N13: the same LayerNorm kernels were priced by NORM001
and ELEM001, a fused F.layer_norm led ELEM001's receipts, and ELEM001's share of the step
included launches that the table puts under launch-and-idle)."""

import dataclasses

from audit_helpers import captured, mark_line, run_rule

from levers.audit.options import AuditOptions
from levers.audit.bottleneck import ELEMENTWISE, step_bottleneck
from levers.audit.config import make_config
from levers.audit.cost.roofline import KERNEL_OVERHEAD_US
from levers.audit.rules.registry import all_rules

HAND_WRITTEN = "fire_elementwise_after_a_hand_written_norm"
FUSED = "fire_elementwise_after_a_fused_norm"


def _config(name):
    capture, _ = captured("ELEM001", name)
    return capture, make_config(capture, AuditOptions.checked(gpu="h100", torch_version="2.11"))


def test_no_kernel_is_priced_by_both_norm001_and_elem001():
    capture, config = _config(HAND_WRITTEN)
    norm_findings = list(all_rules()["NORM001"].check(capture, config))
    assert len(norm_findings) == 1, "the fixture's hand-written LayerNorm is NORM001's pattern"
    [finding] = run_rule("ELEM001", HAND_WRITTEN)
    norm_ops = set(norm_findings[0].work.now_ops)
    assert norm_ops and not norm_ops & set(finding.work.now_ops)
    norm_lines = range(mark_line("ELEM001", "hand_written_norm"), mark_line("ELEM001", "hand_written_norm") + 3)
    assert [r.line for r in finding.receipts if r.line in norm_lines] == []
    assert "kernels of hand-written norms are NORM001's" in finding.message


def test_a_fused_norm_is_not_an_elementwise_receipt():
    [finding] = run_rule("ELEM001", FUSED)
    fused_line = mark_line("ELEM001", "fused_layer_norm")
    assert fused_line not in [r.line for r in finding.receipts]
    assert "kernels of fused norms already run as one kernel per call" in finding.message


def test_kernel_time_and_launches_add_up_as_in_the_op_class_table():
    capture, config = _config(FUSED)
    [finding] = run_rule("ELEM001", FUSED)
    details = finding.details
    assert details["launch_us"] == details["num_kernels"] * KERNEL_OVERHEAD_US
    assert abs(details["kernel_us"] + details["launch_us"] - finding.cost.now_ms * 1e3) < 1e-6
    table = step_bottleneck(capture, dataclasses.replace(config, on_gpu=False))
    # its kernels are a part of the table's elementwise class, never more
    assert details["kernel_us"] <= table.of(ELEMENTWISE).time_ms * 1e3 + 1e-9
    assert "of kernel time (part of the op-class table's elementwise row)" in finding.message
    assert "(part of its launch-and-idle row)" in finding.message
