"""ab on a CUDA device: event timing, per-side memory windows, the memory gate.

Run on the device machine: pytest tests/ab -m gpu
"""

from __future__ import annotations

import pytest
import torch
from ab_helpers import side

from levers.ab.runner import AbConfig, run_ab
from levers.ab.verdict import DAMAGED, PARITY

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

MIB = 1024**2
CONFIG = dict(num_steps=10, num_warmup=2, num_parity_steps=2, num_resamples=500)


def test_a_over_a_memory_is_identical_and_parity():
    result = run_ab(side(device="cuda", dim=256), side(device="cuda", dim=256), AbConfig(**CONFIG))
    base, cand = result.samples["baseline"], result.samples["candidate"]
    assert all(d > 0 for d in base.dur_ms + cand.dur_ms)
    assert base.resident_bytes_start == cand.resident_bytes_start > 0
    assert result.read("peak_allocated").verdict == PARITY
    assert result.read("peak_allocated").ci.ratio == 1.0
    assert result.read("peak_reserved").baseline is not None
    assert result.read("parity").verdict == PARITY
    assert result.killed is None


def test_a_sides_own_transient_and_resident_bytes_are_attributed_to_it():
    # the candidate holds 64 MiB more during each step and 32 MiB more between steps; the
    # baseline, resident in the same process, is not charged for either
    result = run_ab(
        side(device="cuda", dim=256),
        side(device="cuda", dim=256, transient_bytes=64 * MIB, resident_bytes=32 * MIB),
        AbConfig(**CONFIG),
    )
    base, cand = result.samples["baseline"], result.samples["candidate"]
    assert cand.resident_bytes_start - base.resident_bytes_start == 32 * MIB
    extra = [
        c - b for b, c in zip(base.peak_allocated_bytes, cand.peak_allocated_bytes, strict=True)
    ]
    assert all(abs(e - 96 * MIB) <= MIB for e in extra), extra
    assert result.read("peak_allocated").verdict == DAMAGED


def test_the_memory_gate_kills_the_side_that_crosses_it():
    result = run_ab(
        side(device="cuda", dim=256),
        side(device="cuda", dim=256, transient_bytes=256 * MIB),
        AbConfig(**CONFIG, mem_gate_gib=0.125),
    )
    kill = result.killed
    assert (kill.kind, kill.phase, kill.side, kill.step) == ("memory_gate", "timed", "candidate", 1)
    assert "exceeds the memory gate of 0.12 GiB" in kill.reason
    # on CUDA the sides alternate in windows (levers.ab.timing): the baseline's first window of
    # these millisecond steps is a quarter of the timed steps, run before the candidate's first
    assert len(result.samples["baseline"].dur_ms) == CONFIG["num_steps"] // 4


def test_a_nan_loss_is_found_after_the_timed_loop_without_syncs_inside_it():
    # 2 parity + 2 warm-up steps: the candidate's 7th step is its 3rd timed step
    result = run_ab(side(device="cuda"), side(device="cuda", nan_at=7), AbConfig(**CONFIG))
    kill = result.killed
    assert (kill.kind, kill.phase, kill.side, kill.step) == (
        "nonfinite_loss",
        "timed",
        "candidate",
        3,
    )
    # the loop ran to the end before the one sync found it
    assert len(result.samples["candidate"].dur_ms) == CONFIG["num_steps"]


def test_sides_one_at_a_time_hold_the_device_one_side_at_a_time():
    # each side holds 1 GiB of ballast between its steps: together, the candidate's steps run
    # beside the baseline's gigabyte; one at a time, the baseline's is freed before the
    # candidate is built, so the pool's window peak over the candidate's steps holds one
    ballast = 1024 * MIB
    reserved = {}
    for sides in ("together", "one-at-a-time"):
        torch.cuda.empty_cache()
        result = run_ab(
            side(device="cuda", dim=256, resident_bytes=ballast),
            side(device="cuda", dim=256, resident_bytes=ballast),
            AbConfig(**CONFIG, sides=sides),
        )
        assert result.read("parity").verdict == PARITY and result.killed is None
        cand = result.samples["candidate"]
        assert cand.resident_bytes_start >= ballast
        reserved[sides] = min(cand.peak_reserved_bytes)
    assert reserved["together"] >= 2 * ballast
    assert reserved["one-at-a-time"] < 2 * ballast - 256 * MIB
    # neither side's gigabyte is left; what stays is the allocator's own (cuBLAS's workspaces are
    # allocated through it: 65 MiB were left on an H100, bench/results/tune_sweep_h100)
    assert torch.cuda.memory_allocated() < ballast // 4


def test_a_decided_a_b_stops_its_timed_steps_at_a_look_on_the_device():
    # the candidate spins ~2 ms more per step on the GPU, far beyond a step's jitter: the looks
    # read the event times (one synchronize between steps) and stop at the first, 10 of 40
    result = run_ab(side(device="cuda", dim=256), side(device="cuda", dim=256, spin_cycles=4_000_000),
                    AbConfig(**{**CONFIG, "num_steps": 40}, stop_when_decided=True))
    assert result.killed is None and result.read("parity").verdict == PARITY
    base, cand = result.samples["baseline"], result.samples["candidate"]
    assert len(base.dur_ms) == len(cand.dur_ms) == 10
    assert result.read("step_time").ci.lo > 1.0
    assert any("stopped after 10 of 40 per side" in w for w in result.warnings)


def test_sides_one_at_a_time_stop_the_candidate_s_steps_at_a_look_on_the_device():
    # the baseline's steps are timed first, all 40 or, where their median is settled, 10 (its
    # jitter decides); the candidate, ~2 ms slower a step, is looked at against as many of them
    # (its event times read between steps) and stops at the first look
    result = run_ab(side(device="cuda", dim=256), side(device="cuda", dim=256, spin_cycles=4_000_000),
                    AbConfig(**{**CONFIG, "num_steps": 40}, stop_when_decided=True,
                             sides="one-at-a-time"))
    assert result.killed is None and result.read("parity").verdict == PARITY
    timed = len(result.samples["baseline"].dur_ms)
    assert timed in (10, 40)
    assert len(result.samples["candidate"].dur_ms) == 10
    assert result.read("step_time").ci.lo > 1.0
    said = ("the baseline's timed steps stopped after 10 of 40: their median was settled" if
            timed == 10 else "the candidate's timed steps stopped after 10 of 40")
    assert any(w.startswith(said) for w in result.warnings)
