"""The merged report of a launch: every rank's step, the straggler, and what failed."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from levers.distributed.summary import RankSummary

SCHEMA = "levers.distributed/1"


@dataclass(frozen=True)
class Straggler:
    rank: int
    step_s: float
    median_s: float  # median over the ranks of each rank's median step

    @property
    def over_median(self) -> float:
        """How much slower than the median rank, as a fraction (0.05 = 5 %)."""
        return self.step_s / self.median_s - 1.0 if self.median_s > 0 else 0.0


@dataclass(frozen=True)
class DistributedReport:
    world_size: int
    ranks: tuple[RankSummary, ...]  # the ranks that answered, in rank order
    missing: tuple[int, ...]  # ranks that did not answer in time
    timeout_s: float

    @property
    def errors(self) -> tuple[RankSummary, ...]:
        return tuple(r for r in self.ranks if r.error is not None)

    @property
    def ok(self) -> bool:
        return not self.errors and not self.missing

    @property
    def straggler(self) -> Straggler | None:
        timed = [r for r in self.ranks if r.median_step_s is not None]
        if len(timed) < 2:
            return None
        slowest = max(timed, key=lambda r: (r.median_step_s, -r.rank))
        median = statistics.median(r.median_step_s for r in timed)
        return Straggler(rank=slowest.rank, step_s=slowest.median_step_s, median_s=median)

    def failure_messages(self) -> list[str]:
        """One line per failed rank: ``rank 1 raised ValueError: boom``."""
        lines = [f"rank {r.rank} raised {r.error}" for r in self.errors]
        if self.missing:
            which = ", ".join(str(m) for m in self.missing)
            lines.append(
                f"rank{'s' if len(self.missing) > 1 else ''} {which} did not answer within "
                f"{self.timeout_s:g} s (hung, or the process died)"
            )
        return lines

    def to_dict(self) -> dict[str, Any]:
        straggler = self.straggler
        return {
            "schema": SCHEMA,
            "world_size": self.world_size,
            "ranks": [r.to_dict() for r in self.ranks],
            "missing": list(self.missing),
            "timeout_s": self.timeout_s,
            "straggler": None
            if straggler is None
            else {
                "rank": straggler.rank,
                "step_s": straggler.step_s,
                "median_s": straggler.median_s,
                "over_median": straggler.over_median,
            },
            "failures": self.failure_messages(),
        }


def merge(
    records: tuple[dict[str, Any], ...] | list[dict[str, Any]],
    world_size: int,
    missing: tuple[int, ...] = (),
    timeout_s: float = 0.0,
) -> DistributedReport:
    ranks = tuple(sorted((RankSummary.from_dict(r) for r in records), key=lambda r: r.rank))
    return DistributedReport(
        world_size=world_size, ranks=ranks, missing=tuple(missing), timeout_s=timeout_s
    )
