"""``levers ab`` under torchrun: both sides on every rank, the verdict from rank 0.

    torchrun --nproc_per_node=N -m levers ab BASELINE [CANDIDATE] --lever L [ab options]

Every rank runs the whole experiment on its own data (parity, warm-up, the timed steps of both
sides, interleaved as usual). Each rank then sends its step times to rank 0
(:mod:`levers.distributed.exchange`), which times a step of the launch as its slowest rank's
(a data-parallel step ends when the last rank's does), recomputes the reads and the decision on
those, and records and prints the result. Tokens/s stay per rank (the workload's own
``tokens_per_step``); the verdict, a ratio, is the same either way. Parity and the quality read
are rank 0's. The other ranks print nothing but their errors.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from levers.ab.reads import compute_reads
from levers.ab.runner import run_ab
from levers.ab.verdict import decision
from levers.distributed.failures import RanksFailed, rank_error
from levers.distributed.exchange import connect
from levers.distributed.merge import merge
from levers.distributed.summary import error_text
from levers.distributed.world import World

TAG = "ab"


def _record(world: World, result: Any, error: BaseException | None) -> dict[str, Any]:
    if error is not None:
        return {"rank": world.rank, "world_size": world.world_size, "error": error_text(error)}
    samples = result.samples or {}
    return {
        "rank": world.rank,
        "world_size": world.world_size,
        "error": None,
        "dur_ms": {side: list(s.dur_ms) for side, s in samples.items()},
    }


def slowest_rank_steps(records: list[dict[str, Any]], side: str) -> tuple[float, ...]:
    """Per step, the slowest rank's duration (over the steps that every rank completed)."""
    series = [r["dur_ms"][side] for r in records if side in (r.get("dur_ms") or {})]
    if not series:
        return ()
    num_steps = min(len(s) for s in series)
    return tuple(max(s[i] for s in series) for i in range(num_steps))


def merged_result(result: Any, records: list[dict[str, Any]], world_size: int) -> Any:
    """Rank 0's result with the launch's step times, and the reads and decision recomputed."""
    if result.samples is None:
        return result
    samples = {
        side: replace(s, dur_ms=slowest_rank_steps(records, side))
        for side, s in result.samples.items()
    }
    config = result.config
    reads = compute_reads(
        samples,
        {
            "baseline": result.baseline.tokens_per_step if result.baseline else None,
            "candidate": result.candidate.tokens_per_step if result.candidate else None,
        },
        result.parity,
        num_resamples=config.num_resamples,
        seed=config.seed,
        confidence=config.confidence,
    )
    verdicts = {r.name: r.verdict for r in reads}
    if result.quality is not None:
        verdicts["quality"] = result.quality.verdict
    note = (
        f"step times are the slowest of {world_size} ranks at each step (torchrun); tokens/s "
        "are per rank; parity and quality are rank 0's"
    )
    return replace(
        result,
        samples=samples,
        reads=reads,
        decision=decision(verdicts, killed=result.killed is not None),
        warnings=(*result.warnings, note),
    )


def run_ab_distributed(baseline: Any, candidate: Any, config: Any, world: World, timeout_s: float):
    """Rank 0: the merged result (raises RanksFailed when a rank failed); others: None."""
    result = error = None
    try:
        result = run_ab(baseline, candidate, config)
    except Exception as exc:  # noqa: BLE001 - reported to rank 0 first, then raised below
        error = exc
    exchange = connect(world, timeout_s)
    gathered = exchange.gather(TAG, _record(world, result, error))
    if not world.is_leader:
        outcome = exchange.outcome(TAG)
        if error is not None:
            raise rank_error(world, error)
        if not outcome.get("ok"):
            raise RanksFailed(f"rank {world.rank}: stopped, rank 0 reported a failed rank")
        return None
    assert gathered is not None
    report = merge(
        [{"rank": r["rank"], "world_size": r["world_size"], "error": r.get("error")} for r in gathered.records],
        world.world_size,
        gathered.missing,
        gathered.timeout_s,
    )
    ok = report.ok and error is None
    exchange.publish(TAG, {"ok": ok})
    if error is not None:
        raise error
    if not report.ok:
        raise RanksFailed("; ".join(report.failure_messages()))
    return merged_result(result, list(gathered.records), world.world_size)
