"""Ranking on a CPU capture of the ``hf`` llama, estimated for an H200 with levers memory's
prediction and batch fit, as ``levers audit hf --set size=tiny seq_len=256 --target h200`` does.

What the ranking must show, and why at this size:
- the memory model predicts ~0.1 GiB reserved of 139 GiB: throughput-bound, so freed memory
  weighs nothing in the payoff and MEM001 is reported as not recommended, last, with the numbers
  (its recomputation only costs time; the batch fits without it);
- at width 64 every kernel is tiny: the estimate is launch-bound (the roofline's 2 us per
  kernel is most of the step), so the larger batch (MEM003, raise-batch) buys the most tokens/s,
  then the regional compile that removes most elementwise kernels (ELEM001), ahead of the
  fused-kernel findings it covers (NORM001, FUSE002, FUSE001);
- the stack takes each finding's lever in rank order, skips those a regional compile covers
  and, on this CPU, raise-batch (it needs a CUDA device), and the audit prints the one
  `levers ab` command with the workload and --set as given.
At size=1b on the H200 the step is measured; the lead's GPU run checks that order there.
"""

from __future__ import annotations

import functools

import pytest

from levers.audit.options import AuditOptions
from levers.audit import audit
from levers.audit.run import predicted_memory
from levers.audit.rank import payoff
from levers.capture import capture_step
from levers.cli import build_parser
from levers.loader import load_workload, parse_set

ARGS = ["audit", "hf", "--set", "size=tiny", "seq_len=256", "batch_size=4", "--target", "h200"]


@functools.cache
def audited():
    pytest.importorskip("transformers")
    args = build_parser().parse_args(ARGS)
    workload = load_workload(args.workload, parse_set(args.set_items))
    capture = capture_step(workload, warmup=1, timed=0)
    memory = predicted_memory(
        args.workload, parse_set(args.set_items), capture, ["MEM001", "MEM003"],
        gpu=args.target,
    )
    options = AuditOptions.checked(
        gpu="h200", workload_spec=args.workload, set_items=args.set_items
    )
    result = audit(capture, options, memory=memory)
    return capture, memory, result


def test_throughput_bound_with_a_batch_fit():
    _, memory, result = audited()
    assert result.bottleneck.bound == "throughput-bound"
    assert memory.batch_now == 4 and memory.batch_fit == 64  # the fit's cap: 16x the batch
    # one fit, read by MEM001 and MEM003 alike, its cap stated where they print it
    assert memory.batch_fit_cap == 64 and "16x the batch now" in memory.batch_fit_note
    mem003 = next(f for f in result.findings if f.code == "MEM003")
    assert "batch_size=64 or more (the search stops at 16x the batch now)" in mem003.message
    mem001 = next(f for f in result.findings if f.code == "MEM001")
    assert mem001.details["batch_fit_checkpointed"] <= 64  # the same cap, not a line to 265k


def test_ranked_by_tokens_per_second_and_mem001_last():
    capture, _, result = audited()
    codes = [f.code for f in result.findings]
    assert codes == ["MEM003", "NORM001", "FUSE002", "ELEM001", "SYNC001", "FUSE001", "MEM001"]
    mem001 = result.findings[-1]
    assert mem001.details["recommended"] is False and mem001.severity == "low"
    assert "Not recommended: the step is throughput-bound" in mem001.message
    pays = [payoff(f, step_ms=result.step_ms, peak_bytes=capture.memory.peak_bytes, weight=0.0)
            for f in result.findings]
    assert pays == sorted(pays, reverse=True)


def test_stack_and_the_ab_command():
    _, _, result = audited()
    rec = result.recommendation
    # NORM001's rms-norm-fused and the FUSE findings' liger-kernels are covered by compile-blocks;
    # raise-batch (MEM003) needs a CUDA device, and this capture ran on a CPU: left out, said why
    assert rec.levers == ("compile-blocks",)
    assert rec.codes == ("FUSE002",)
    assert rec.command == (
        "levers ab hf --set size=tiny seq_len=256 batch_size=4 --lever compile-blocks"
    )
    assert any(note.startswith("MEM003: raise-batch left out: it needs a CUDA GPU") for note in rec.notes)
