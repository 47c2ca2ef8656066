"""The parts of levers under torchrun that run in one process: the world from the environment,
one rank's record of a DDP capture, the merge, and the exchange over an in-memory store."""

from __future__ import annotations

import datetime
import json
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parents[1]))
from ddp_in_process import ddp  # noqa: E402

from levers import Workload
from levers.capture import capture_step
from levers.distributed.exchange import Exchange, RankTimeout
from levers.distributed.merge import merge
from levers.distributed.render import markdown
from levers.distributed.summary import failed, summarize
from levers.distributed.world import World, world_from_env
from levers.errors import LeversError, StepError


def test_world_from_env():
    assert world_from_env({}) == World(rank=0, world_size=1, local_rank=0)
    world = world_from_env({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"})
    assert world == World(rank=3, world_size=4, local_rank=1)
    assert world.is_distributed and not world.is_leader
    with pytest.raises(LeversError, match="WORLD_SIZE='two' is not an integer"):
        world_from_env({"WORLD_SIZE": "two"})
    with pytest.raises(LeversError, match="RANK=4 is not inside WORLD_SIZE=4"):
        world_from_env({"RANK": "4", "WORLD_SIZE": "4"})


def _ddp_capture(**kwargs):
    torch.manual_seed(0)
    # 4 Linear(16, 16): 4 x 272 parameters
    model = ddp(torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(4)]), **kwargs)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(2, 16)

    def step():
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()

    return capture_step(Workload(model=model, step=step, optimizer=opt), warmup=1, timed=2)


def test_capture_records_ddp_settings():
    capture = _ddp_capture(bucket_cap_mb=0.5, find_unused_parameters=True)
    info = capture.settings["distributed"]
    assert info["strategy"] == "ddp" and info["world_size"] == 1 and info["rank"] == 0
    assert info["ddp"]["bucket_cap_mb"] == 0.5
    assert info["ddp"]["find_unused_parameters"] is True
    assert info["ddp"]["comm_hook"] is None
    assert info["ddp"]["logging"]["num_parameter_tensors"] == 8
    # AdamW: exp_avg and exp_avg_sq (4 x 272 float32 each) and 8 float32 step scalars
    assert capture.settings["optimizer"]["state_bytes"] == 2 * 4 * 272 * 4 + 8 * 4


def test_summary_of_a_ddp_capture_has_its_buckets():
    # DDP closes a bucket once it holds the cap: one layer's bias and weight (272 x 4 = 1088 bytes)
    cap_mb = 1088 / 2**20
    capture = _ddp_capture(bucket_cap_mb=cap_mb)
    record = summarize(capture, rank=0, world_size=2)
    assert [b.bytes for b in record.buckets] == [1088, 1088, 1088, 1088]
    assert {b.dtype for b in record.buckets} == {"float32"}
    (allreduce,) = record.collectives
    assert (allreduce.name, allreduce.count, allreduce.bytes) == ("allreduce", 4, 4352)
    assert record.comm_us == pytest.approx(sum(b.time_us for b in record.buckets))
    assert record.error is None and record.median_step_s == capture.timing.median_s
    # the record survives its trip through JSON
    again = type(record).from_dict(json.loads(json.dumps(record.to_dict())))
    assert again == record


def _record(rank: int, step_s: float) -> dict:
    return {
        "rank": rank,
        "world_size": 4,
        "step_s": [step_s],
        "median_step_s": step_s,
        "captured_step_s": step_s,
    }


def test_merge_names_the_straggler_and_the_failures():
    records = [_record(0, 0.100), _record(1, 0.130), _record(3, 0.110)]
    error = failed(2, 4, StepError("wrapped")).to_dict()
    report = merge(records + [error], world_size=4)
    s = report.straggler
    assert (s.rank, s.step_s, s.median_s) == (1, 0.130, 0.110)
    assert s.over_median == pytest.approx(0.130 / 0.110 - 1)
    assert [r.rank for r in report.ranks] == [0, 1, 2, 3]
    assert report.failure_messages() == ["rank 2 raised StepError: wrapped"]
    assert not report.ok
    missing = merge(records, world_size=4, missing=(2,), timeout_s=20)
    assert missing.failure_messages() == ["rank 2 did not answer within 20 s (hung, or the process died)"]
    text = markdown(missing)
    assert "| 2 | no answer | within 20 s |  |  |" in text
    assert "Straggler: rank 1, 130 ms per step, 18.2% over the median rank (110 ms)." in text


def test_the_error_record_names_the_users_exception():
    try:
        try:
            raise ValueError("boom")
        except ValueError as exc:
            raise StepError("the step raised ValueError: boom; fix it") from exc
    except StepError as wrapped:
        assert failed(1, 2, wrapped).error == "ValueError: boom"


def _exchange(store, rank: int, world_size: int, timeout_s: float) -> Exchange:
    return Exchange(World(rank, world_size, rank), store, timeout_s)


def test_exchange_gathers_in_rank_order_and_names_missing_ranks():
    store = dist.HashStore()
    store.set_timeout(datetime.timedelta(seconds=5))
    _exchange(store, 2, 3, 0.2).gather("t", {"rank": 2})
    _exchange(store, 1, 3, 0.2).gather("t", {"rank": 1})
    gathered = _exchange(store, 0, 3, 0.2).gather("t", {"rank": 0})
    assert [r["rank"] for r in gathered.records] == [0, 1, 2] and gathered.missing == ()
    partial = _exchange(store, 0, 3, 0.2).gather("u", {"rank": 0})
    assert [r["rank"] for r in partial.records] == [0] and partial.missing == (1, 2)
    assert partial.missing_message().startswith("ranks 1, 2 did not answer within 0.2 s")
    follower = _exchange(store, 1, 3, 0.2)
    with pytest.raises(RankTimeout, match="rank 1: rank 0 did not answer within 0.2 s"):
        follower.outcome("u")
    _exchange(store, 0, 3, 0.2).publish("t", {"ok": True})
    assert follower.outcome("t") == {"ok": True}


def test_ab_times_a_step_of_the_launch_as_its_slowest_rank():
    from levers.distributed.ab import slowest_rank_steps

    records = [
        {"rank": 0, "dur_ms": {"baseline": [10.0, 12.0, 11.0], "candidate": [9.0, 9.5]}},
        {"rank": 1, "dur_ms": {"baseline": [11.0, 10.0, 13.0], "candidate": [8.0, 9.9]}},
    ]
    assert slowest_rank_steps(records, "baseline") == (11.0, 12.0, 13.0)
    assert slowest_rank_steps(records, "candidate") == (9.0, 9.9)
    # a rank that stopped early (a kill line) bounds the steps compared
    records[1]["dur_ms"]["baseline"] = [11.0]
    assert slowest_rank_steps(records, "baseline") == (11.0,)


def test_exposed_communication_from_ddps_own_timing():
    from levers.distributed.render import exposed_line
    from levers.distributed.summary import RankSummary

    logging = {"iteration": 4, "backward_comm_time": 5_000_000, "backward_compute_comm_overlap_time": 1_500_000}
    r = RankSummary(rank=1, world_size=2, distributed={"ddp": {"logging": logging}})
    assert exposed_line(r) == (
        "rank 1: DDP's own timing of iteration 4: backward communication 5.00 ms, 1.50 ms of it "
        "overlapped with backward compute, 3.50 ms exposed"
    )
    assert exposed_line(RankSummary(rank=0, world_size=2)) is None
