"""Interim looks at an A/B's timed steps: stop once the step-time ratio is decided.

``levers tune`` runs many A/Bs against one budget, and a confirmation or a proof may be asked
for up to five times its steps (the time left over goes to them). Where the two sides differ by
far more than their jitter, the first quarter of those steps already decides, and the rest is
budget another lever could have used. So an A/B with ``AbConfig.stop_when_decided`` looks at its
paired step times after a quarter, a half and three quarters of its timed steps (each look at
:data:`MIN_LOOK_PAIRS` pairs or more) and stops there when the paired bootstrap interval of the
median step-time ratio at :data:`INTERIM_CONFIDENCE` lies wholly on one side of 1.

Why that level: each look is one more chance for a no-op to read as decided by noise. At 99.9%
per look (a 0.05% tail on each side), three interim looks add at most 0.3% to the 5% of the final
CI95, and by the Bonferroni bound the whole A/B stays below 5.3% (O'Brien-Fleming's and Pocock's
group-sequential designs spend their error across looks in the same way). The judgement itself
is unchanged: the result's reads are ab's CI95 over the steps that ran, which such a stop
always leaves on the same side of 1 as the look did. ``levers ab`` itself times every step it is
asked for: a pre-registered run's step count is part of its design.

Where the sides run one at a time, the baseline is timed first, with nothing yet to compare its
steps with: its own steps stop at a look where their median is settled (its interval at
:data:`INTERIM_CONFIDENCE` within :data:`SETTLED_SHARE` of it on either side), and the candidate
is timed as many steps at most, each look pairing its steps with as many of the baseline's. The
stop reads the baseline's jitter alone, nothing of the candidate, so the ratio's CI95 over the
pairs timed is what it would be for an A/B asked for that many steps. On glm_moe_dsa (H100, s52)
the eager baseline's 20 steps of 1.2 s, timed in full while the candidate's stopped after 10,
were 24 of each A/B's 74 s and 51 s, where its steps varied by 0.15%.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from levers.ab.stats import median_ci, paired_ratio_ci

INTERIM_CONFIDENCE = 0.999
# the baseline of sides one at a time stops where its median's interval at INTERIM_CONFIDENCE is
# within this share of it on either side: a candidate that gains 1.5% is then still decided
SETTLED_SHARE = 0.005
# fewer pairs than this give a bootstrap of the median too coarse to read at 99.9%
MIN_LOOK_PAIRS = 8
# a 0.05% tail of 4000 resamples is two of them
INTERIM_RESAMPLES = 4000


def looks(num_steps: int) -> tuple[int, ...]:
    """The steps after which an A/B of ``num_steps`` timed steps per side looks: a quarter, a
    half and three quarters of them, each with at least :data:`MIN_LOOK_PAIRS` pairs."""
    points = {num_steps // 4, num_steps // 2, (3 * num_steps) // 4}
    return tuple(sorted(k for k in points if MIN_LOOK_PAIRS <= k < num_steps))


def decided(durations: Mapping[str, Sequence[float]], *, seed: int = 0) -> bool:
    """Whether the paired step times so far (``"baseline"`` and ``"candidate"``, milliseconds in
    step order) decide the ratio: its :data:`INTERIM_CONFIDENCE` interval excludes 1."""
    base, cand = durations["baseline"], durations["candidate"]
    n = min(len(base), len(cand))
    if n < MIN_LOOK_PAIRS:
        return False
    ci = paired_ratio_ci(base[:n], cand[:n], num_resamples=INTERIM_RESAMPLES, seed=seed,
                         confidence=INTERIM_CONFIDENCE)
    return ci.lo > 1.0 or ci.hi < 1.0


def settled(durations: Sequence[float], *, seed: int = 0) -> bool:
    """Whether one side's step times so far (milliseconds) pin its median down: its
    :data:`INTERIM_CONFIDENCE` interval within :data:`SETTLED_SHARE` of it on either side."""
    if len(durations) < MIN_LOOK_PAIRS:
        return False
    median, lo, hi = median_ci(durations, num_resamples=INTERIM_RESAMPLES, seed=seed,
                               confidence=INTERIM_CONFIDENCE)
    return median - lo <= SETTLED_SHARE * median and hi - median <= SETTLED_SHARE * median


def timed_pairs(samples: Mapping[str, Any] | None) -> int:
    """How many steps each side timed (the fewer of the two), 0 without samples."""
    return min((len(s.dur_ms) for s in (samples or {}).values()), default=0)


def stopped_note(num_steps: int, samples: Mapping[str, Any] | None,
                 one_at_a_time: bool = False) -> tuple[str, ...]:
    """The note of an A/B whose timed steps stopped at a look, or none. ``one_at_a_time``: only
    the candidate's steps stopped (the baseline's were timed first, all of them), and the reads
    pair as many of the baseline's."""
    timed = timed_pairs(samples)
    if not 0 < timed < num_steps:
        return ()
    decided_there = (f"the step-time ratio was decided there ({INTERIM_CONFIDENCE:.1%} interval "
                     "clear of 1 at an interim look, levers.ab.looks)")
    if one_at_a_time:
        base = len(samples["baseline"].dur_ms)
        if base < num_steps:
            said = (f"the baseline's timed steps stopped after {base} of {num_steps}: their "
                    f"median was settled there ({INTERIM_CONFIDENCE:.1%} interval within "
                    f"{SETTLED_SHARE:.1%} of it, levers.ab.looks), and the candidate was timed "
                    "as many steps at most")
            if timed < base:
                said += (f"; its timed steps stopped after {timed}: {decided_there}; the reads "
                         f"pair them with the baseline's first {timed}")
            return (said,)
        return (f"the candidate's timed steps stopped after {timed} of {num_steps}: "
                f"{decided_there}; the reads pair them with the baseline's first {timed}",)
    return (f"the timed steps stopped after {timed} of {num_steps} per side: {decided_there}",)
