"""Greedy forward selection of levers by paired A/B, under a time budget.

    stack = []
    for each group of alternatives, best expected saving first:
        for each alternative that can be stacked with the stack:
            A/B  stack + [lever]  against  stack          (the increment, paired, with CI95)
        keep the fastest alternative whose increment paid (judge: parity held, CI95 above 1)
    A/B  stack  against the baseline                      (the proof of the whole stack)

The first lever kept is proven against the baseline by its own A/B. A stack of two or more is
proven by one more A/B against the baseline at the end; if that A/B does not pay (the
increments' gains did not add up, or parity drifted over the stack), the answer falls back to
the largest stack that was proven. So the answer is never slower than the baseline: it is a
stack whose A/B against the baseline paid, or no stack ("nothing pays here", with each lever's
reason).

The budget: before each A/B the search checks that the time left holds one more A/B (the
longest so far) and, once the stack would need it, the final proof; each A/B is given the time
left as its kill line. When time runs out the search stops cleanly and returns what was proven.

The search never times anything itself: ``measure`` is ab (:mod:`levers.tune.measure`), or a
test's fake. ``clock`` is only for the budget.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from levers.tune.budget import format_duration
from levers.tune.candidates import Candidate, Skipped, covered_by, exclusive_with, groups
from levers.tune.trial import Measure, Stack, Trial, judge, speed_of

OUT_OF_BUDGET = "not tried: the time budget ran out"


@dataclass(frozen=True)
class Outcome:
    """What the search did with one lever."""

    lever: str
    kept: bool
    reason: str
    trial: int | None = None  # index of its A/B in SearchResult.trials
    source: str = ""  # where its expected saving came from


@dataclass(frozen=True)
class SearchResult:
    stack: Stack  # the proven stack; () when nothing pays
    proof: Trial | None  # its A/B against the baseline
    outcomes: tuple[Outcome, ...]  # every lever, tried or not, in the order considered
    trials: tuple[Trial, ...]  # every A/B, in the order run
    budget_s: float
    spent_s: float
    out_of_budget: bool
    notes: tuple[str, ...] = ()


def _ignore(_: object) -> None:
    pass


def search(
    ordered: Sequence[Candidate],
    measure: Measure,
    *,
    budget_s: float,
    skipped: Sequence[Skipped] = (),
    clock: Callable[[], float] = time.monotonic,
    say: Callable[[str], None] = _ignore,
    on_trial: Callable[[Trial], None] = _ignore,
) -> SearchResult:
    """The fastest stack of ``ordered`` that keeps parity, found by A/Bs from ``measure``."""
    start = clock()
    trials: list[Trial] = []
    outcomes: dict[str, Outcome] = {}
    notes: list[str] = []
    stack: list[str] = []
    proof: Trial | None = None
    longest_s = 0.0
    stopped = False

    def left_s() -> float:
        return budget_s - (clock() - start)

    def run(base: Stack, candidate: Stack, what: str) -> Trial:
        nonlocal longest_s
        say(f"tune: {what} (A/B {len(trials) + 1}, {format_duration(left_s())} left)")
        before = clock()
        trial = measure(base, candidate, max(left_s(), 1e-3))
        longest_s = max(longest_s, clock() - before)
        trials.append(trial)
        on_trial(trial)
        return trial

    for group in groups(ordered):
        paid: list[tuple[Candidate, Trial, str, int]] = []
        for candidate in group:
            lever = candidate.lever
            clash = exclusive_with(lever, stack)
            if clash is not None:
                outcomes[lever] = Outcome(
                    lever, False, f"not tried: it does not stack with {clash}, which was kept",
                    source=candidate.source,
                )
                continue
            cover = covered_by(lever, stack)
            if cover is not None:
                outcomes[lever] = Outcome(
                    lever, False, f"not tried: {cover}, which was kept, already does what it does",
                    source=candidate.source,
                )
                continue
            # one more A/B, and the final proof once the stack would hold two levers (an
            # alternative of this group replaces its rival, so it adds no lever of its own)
            needed_s = longest_s * (2 if stack else 1)
            if stopped or left_s() <= 0 or left_s() < needed_s:
                stopped = True
                outcomes[lever] = Outcome(lever, False, OUT_OF_BUDGET, source=candidate.source)
                continue
            on_top = f" on top of {','.join(stack)}" if stack else ""
            trial = run(tuple(stack), (*stack, lever), f"trying {lever}{on_top}")
            pays, why = judge(trial)
            if trial.out_of_time:
                stopped = True
            if pays:
                paid.append((candidate, trial, why, len(trials) - 1))
            else:
                outcomes[lever] = Outcome(lever, False, why, len(trials) - 1, candidate.source)
        if not paid:
            continue
        best = max(paid, key=lambda p: speed_of(p[1]))
        for candidate, trial, why, index in paid:
            if candidate is best[0]:
                outcomes[candidate.lever] = Outcome(
                    candidate.lever, True, why, index, candidate.source
                )
            else:
                outcomes[candidate.lever] = Outcome(
                    candidate.lever, False,
                    f"{why}, but its alternative {best[0].lever} paid more "
                    f"({speed_of(best[1]):.3f}x against {speed_of(trial):.3f}x)",
                    index, candidate.source,
                )
        stack.append(best[0].lever)
        if len(stack) == 1:
            proof = best[1]  # its A/B was against the baseline

    final: Stack = proof.stack if proof is not None else ()
    if len(stack) >= 2:
        if left_s() > 0:
            trial = run((), tuple(stack), f"proving {','.join(stack)} against the baseline")
            pays, why = judge(trial)
            if pays:
                proof, final = trial, tuple(stack)
            else:
                notes.append(
                    f"the stack {','.join(stack)} against the baseline: {why}; the answer is "
                    f"the largest stack proven, {','.join(final)}"
                )
        else:
            notes.append(
                f"no time was left to prove the stack {','.join(stack)} against the baseline; "
                f"the answer is the largest stack proven, {','.join(final)}"
            )
    for lever in stack:
        if lever not in final:
            kept = outcomes[lever]
            outcomes[lever] = Outcome(
                lever, False,
                f"{kept.reason} over {','.join(stack[: stack.index(lever)]) or 'the baseline'}, "
                "but the stack with it was not proven against the baseline",
                kept.trial, kept.source,
            )
    considered = [outcomes[c.lever] for c in ordered if c.lever in outcomes]
    considered += [Outcome(s.lever, False, s.reason) for s in skipped]
    return SearchResult(
        stack=final,
        proof=proof if final else None,
        outcomes=tuple(considered),
        trials=tuple(trials),
        budget_s=budget_s,
        spent_s=clock() - start,
        out_of_budget=stopped,
        notes=tuple(notes),
    )
