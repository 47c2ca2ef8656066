"""ELEM001's fix must apply to the model and its lead receipts are the model's own work."""

from audit_helpers import mark_line, run_rule


def test_receipts_are_inside_the_model_not_the_batch_assembly():
    findings = run_rule("ELEM001", "fire_blocks_with_a_batch_assembled_outside_the_model")
    assert len(findings) == 1
    assembly = mark_line("ELEM001", "assembly")
    block_line = mark_line("ELEM001", "fire_elementwise_blocks")
    lines = [r.line for r in findings[0].receipts]
    assert assembly not in lines
    assert lines[0] == block_line


def test_no_repeated_blocks_no_finding():
    assert run_rule("ELEM001", "ok_no_repeated_blocks") == []
