"""levers.audit.summary: exact figures on a hand-built capture (see conftest.py)."""

from __future__ import annotations

import pytest

from levers.audit import summary
from levers.audit.summary import Row, SyncSite

from hand_capture import MODEL, TRAIN, make_ops


def test_totals(capture):
    totals = summary.totals(capture.ops)
    assert totals == summary.Totals(
        num_ops=6, flops=3110, read_bytes=450, write_bytes=244, wall_us=21.0, device_us=None
    )
    assert totals.moved_bytes == 694


def test_totals_with_device_time():
    assert summary.totals(make_ops(device=True)).device_us == 37.5


def test_totals_empty():
    assert summary.totals(()) == summary.Totals(0, 0, 0, 0, 0, None)


def test_by_phase(capture):
    assert summary.by_phase(capture.ops, "flops") == {
        "forward": 1010,
        "backward": 2000,
        "optimizer": 100,
        "other": 0,
    }
    assert summary.by_phase(capture.ops, "bytes") == {
        "forward": 274,
        "backward": 300,
        "optimizer": 120,
        "other": 0,
    }
    assert summary.by_phase(capture.ops, "ops") == {
        "forward": 4,
        "backward": 1,
        "optimizer": 1,
        "other": 0,
    }
    assert list(summary.by_phase((), "flops")) == ["forward", "backward", "optimizer", "other"]


def test_unknown_key():
    with pytest.raises(ValueError, match="unknown key 'time'; use one of flops, bytes"):
        summary.op_value(make_ops()[0], "time")


def test_top_modules_by_flops(capture):
    assert summary.top_modules(capture.ops, "flops", 10) == [
        Row("enc.fc", 3100, 3100 / 3110, 3),
        Row("<outside model>", 10, 10 / 3110, 1),
    ]


def test_top_modules_by_bytes_names_root_and_outside(capture):
    rows = summary.top_modules(capture.ops, "bytes", 10)
    assert [(r.label, r.value, r.num_ops) for r in rows] == [
        ("enc.fc", 570, 3),
        ("enc", 100, 1),
        ("<outside model>", 24, 1),
    ]
    assert rows[0].share == pytest.approx(570 / 694)


def test_top_modules_truncates_to_n(capture):
    assert [r.label for r in summary.top_modules(capture.ops, "bytes", 2)] == ["enc.fc", "enc"]


def test_top_modules_by_device_time():
    rows = summary.top_modules(make_ops(device=True), "device_us", 10)
    assert [(r.label, r.value) for r in rows] == [
        ("enc.fc", 34.0),
        ("enc", 2.0),
        ("<outside model>", 1.0),
        ("<model>", 0.5),
    ]
    assert sum(r.share for r in rows) == pytest.approx(1.0)


def test_top_sources_carry_code(capture):
    assert summary.top_sources(capture.ops, "flops", 10) == [
        Row(f"{MODEL}:10", 3000, 3000 / 3110, 2, "y = x @ self.w"),
        Row("<unknown source>", 100, 100 / 3110, 1, ""),
        Row(f"{TRAIN}:20", 10, 10 / 3110, 1, "loss = F.cross_entropy(logits, labels)"),
    ]


def test_top_sources_by_bytes(capture):
    rows = summary.top_sources(capture.ops, "bytes", 10)
    assert [(r.label, r.value, r.num_ops) for r in rows] == [
        (f"{MODEL}:10", 450, 2),
        ("<unknown source>", 120, 1),
        (f"{MODEL}:11", 100, 2),
        (f"{TRAIN}:20", 24, 1),
    ]


def test_timing_summary(capture):
    timing = summary.timing_summary(capture)
    assert timing.median_s == pytest.approx(0.025)
    assert (timing.min_s, timing.max_s, timing.num_steps) == (0.010, 0.050, 4)
    assert timing.captured_s == 0.100
    assert timing.overhead_ratio == pytest.approx(4.0)
    assert timing.tokens_per_step == 512
    assert timing.tokens_per_s == pytest.approx(20480.0)


def test_timing_summary_without_plain_steps_or_tokens(build_capture):
    from levers.capture.records import StepTiming

    capture = build_capture(timing=StepTiming(step_s=(), captured_step_s=0.2), tokens_per_step=None)
    timing = summary.timing_summary(capture)
    assert (timing.median_s, timing.min_s, timing.max_s, timing.num_steps) == (0.2, 0.2, 0.2, 0)
    assert timing.overhead_ratio is None
    assert timing.tokens_per_s is None


def test_call_summary(capture):
    calls = summary.call_summary(capture.calls)
    assert calls.counts == {"sync": 4, "sdpa": 3, "loss": 1, "memory_metric": 1}
    assert list(calls.counts) == ["sync", "sdpa", "loss", "memory_metric"]
    assert calls.sdpa_backends == {"math": 2, "flash": 1}
    assert calls.sync_sites == (
        SyncSite(f"{TRAIN}:30", "n = int(mask.sum())", ("Tensor.__int__", "item"), 3),
        SyncSite(f"{TRAIN}:31", "if bad.any():", ("Tensor.__bool__",), 1, num_in_torch=1),
    )


def test_call_summary_empty():
    calls = summary.call_summary(())
    assert (calls.counts, calls.sdpa_backends, calls.sync_sites) == ({}, {}, ())
