"""The search's statistics on noise: a lever that does nothing is kept in at most ~1% of searches.

Each A/B here is drawn, seeded, around the true ratio of its stacks: the point ratio has a
spread of 5% from one A/B to the next, and the CI95 it reports is narrower than that spread (by
1.5x, as the drift of a loaded host makes a paired bootstrap of one A/B too sure of itself), so
one A/B of a no-op pays by noise with a chance of P(Z > 1.96 / 1.5), about 9.6%. A search that
keeps a lever on the A/B that selected it keeps the no-op about that often; one that keeps it
only when a fresh A/B of the same increment pays too keeps it about 0.9% of the time, whatever
lever that pays sits beside it.
"""

from __future__ import annotations

import math
import random

from fakes import Clock, ordered

from levers.tune.search import search
from levers.tune.trial import Trial

SPREAD = 0.05  # relative spread of one A/B's point ratio around the truth
OVERCONFIDENCE = 1.5  # the reported CI95 is this much narrower than the real spread
NUM_SEARCHES = 200


def noisy_ab(seed: int, speed: dict[str, float], clock: Clock):
    rng = random.Random(seed)

    def measure(base, stack, time_budget_s, *, steps=None):
        clock.now_s += 10.0
        truth = math.prod(speed.get(lever, 1.0) for lever in stack) / math.prod(
            speed.get(lever, 1.0) for lever in base
        )
        ratio = truth * (1.0 + rng.gauss(0.0, SPREAD))
        half = 1.96 * SPREAD / OVERCONFIDENCE * ratio
        return Trial(
            base=tuple(base), stack=tuple(stack), decision="PARITY",
            tokens_per_s_ratio=ratio, tokens_per_s_ci95=(ratio - half, ratio + half),
            parity="PARITY",
        )

    return measure


def _kept(speed: dict[str, float], levers: list[str]) -> dict[str, int]:
    kept = dict.fromkeys(levers, 0)
    for seed in range(NUM_SEARCHES):
        clock = Clock()
        result = search(ordered(*levers), noisy_ab(seed, speed, clock), budget_s=1e4,
                        clock=clock)
        for lever in result.stack:
            kept[lever] += 1
    return kept


def test_a_no_op_beside_a_lever_that_pays_is_kept_in_at_most_2_percent_of_searches():
    kept = _kept({"fast": 1.3}, ["fast", "no-op", "other-no-op-1", "other-no-op-2"])
    assert kept["no-op"] <= 0.02 * NUM_SEARCHES, kept
    assert kept["fast"] >= 0.95 * NUM_SEARCHES, kept  # what pays is still found


def test_a_no_op_among_no_ops_is_kept_in_at_most_2_percent_of_searches():
    kept = _kept({}, ["no-op", "other-no-op-1", "other-no-op-2", "other-no-op-3"])
    assert kept["no-op"] <= 0.02 * NUM_SEARCHES, kept
    assert sum(kept.values()) <= 0.05 * NUM_SEARCHES, kept
