"""Greedy forward selection of levers by paired A/B, each choice confirmed afresh, under a budget.

    stack = []
    for each group of alternatives, best expected saving first:
        for each alternative that can be stacked with the stack:
            A/B  stack + [lever]  against  stack          (selection: the increment, with CI95)
        the fastest alternative whose increment paid (judge: parity held, CI95 above 1):
            A/B  stack + [lever]  against  stack, afresh  (its confirmation)
            keep it only when that one pays too
    A/B  stack  against the baseline, afresh               (the proof, for two levers or more)

**Why confirmations.** Each selection A/B of a lever that does nothing has its own chance to
pay by noise (about 2.5% at CI95, more on a host whose load drifts), and the search runs one per
candidate: over five candidates, one such lever in eight would be kept. The A/B that picked a
lever is the best-looking of those draws, so it cannot also be its proof. A lever is kept only
when a fresh A/B of the same increment, which selected nothing, pays as well, so a lever that
does nothing is kept only where noise paid it twice, whatever else the stack holds (a
confirmation of the whole stack alone would let it ride on a lever that pays).

**Where the A/Bs are dear** (``defer_alternatives``: each A/B builds and times its sides one at a
time), a group's first form that pays is confirmed and kept at once, the later groups are tried
on top of it, and the group's other forms after them, each in place of the one kept: an A/B of the
stack with it there against the stack as it is, confirmed afresh the same way
(:func:`_substitute`), once the peers' groups (the compile forms, channels-last, float8) are
tried, before the levers ordered by evidence. A late form
(:data:`~levers.tune.candidates.LATE_FORMS`: a compile lever's autotuned form, whose first step
compiles for minutes) is tried so on every step, last of all, and only in place of a form of its
own lever that was kept (the blocks' autotuned form where per-block compile was kept).

**The answer** is a stack whose A/B against the baseline paid in a fresh A/B that selected none
of its levers: for one lever, its confirmation (its base is the baseline); for more, one last
A/B of the whole stack against the baseline. If that one does not pay (gains that do not add
up, parity that drifts over the stack), or no time is left for it, the answer is the first
lever alone, which its confirmation proved, and a note says why. So the answer is never slower
than the baseline: a proven stack, or none ("nothing pays here", each lever's reason).

**The budget.** Before each selection A/B the search checks that the time left holds it (as long
as the median selection so far), the confirmation after it and, once the stack holds a lever,
the proof of the stack (each as long as the median confirmation so far; before any, a selection
less its compiles: the stack's programs are cached by then). Each A/B is given the time left as
its kill line; once a form of a group paid, its other forms are given the time left less the
confirmation of the one that paid (and the proof): they are stopped before it is starved. A group
with fallback forms (per-block compile under CUDA graphs, then compile-model's CUDA graphs
without inductor) keeps :data:`~levers.tune.candidates.FALLBACK_SHARE` of the time left for them
until a form pays: the other forms' kill line is drawn short of it (ab stops a first step that
compiles past its kill line inside the step), and the fallbacks are tried in what is left, in
order, only where none paid and until one pays; where a form's CUDA graphs failed on the step
(an error that names them), the fallbacks, which record graphs too, are not tried, and their
time goes to inductor's default mode, tried next. Once a
form of a group paid, the group's next form is expected to take as long as that form's
selection (forms of one lever compile alike), and a form whose expected saving, thrice over,
could not beat it is not tried (:data:`EXPECTED_SLACK`; not the peers' forms). When
time runs out the search stops selecting and proves what it kept. When the caller says how many
timed steps the A/Bs take (``steps``), a confirmation or the proof is asked for more where the time
left, less what the levers still to try and the proof need, holds them at the pace of the A/Bs
so far (at most :data:`CONFIRM_MAX_FACTOR` times as many): a narrower CI from time that would
otherwise be left over. A selection whose CI95 holds 1 while its point estimate gains at
least :data:`UNDECIDED_MIN_GAIN` (a step whose times jitter) is timed once more with as many
steps, where the time left beside the A/Bs still to run holds them; the longer A/B decides, and
a fresh one still confirms it.

**As you run it.** A compiled stack's A/Bs time the programs their parity steps compiled
(:mod:`levers.tune.measure`: one compile, not two, on a model that draws random numbers, which
then draw them as eager does; a program replayed as CUDA graphs is compiled again for its timed
steps where the time allows, :func:`levers.ab.runner.run_ab`). Where the proof did so and the
time left holds one more cold compile, the answer is timed once more against the baseline as
the user runs it; that A/B is the proof when it pays, and when it does not, nothing is proven
(:func:`_as_run`).

**Ctrl-C** (a ``KeyboardInterrupt`` from the A/B, or an A/B that ab's runner ended as
interrupted) ends the search at once: the result keeps the trials run, the interrupted one
among them, and is marked ``interrupted``; its stack is only what was proven before it.

The search never times anything itself: ``measure`` is ab (:mod:`levers.tune.measure`), or a
test's fake. ``clock`` is only for the budget.
"""

from __future__ import annotations

import math
import re
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from levers.ab.verdict import KILLED, PARITY
from levers.levers.lever import lever_id_of
from levers.tune.budget import format_duration
from levers.tune.candidates import (
    FALLBACK_FORMS,
    FALLBACK_SHARE,
    GRAPH_FORMS,
    LATE_FORMS,
    PEER_FORMS,
    WITHOUT_GRAPHS_FORM,
    Candidate,
    Skipped,
    covered_by,
    exclusive_with,
    groups,
)
from levers.tune.trial import (
    AS_RUN,
    CONFIRMATION,
    INTERRUPTED_KIND,
    SELECTION,
    Measure,
    Stack,
    Trial,
    judge,
    speed_of,
)

OUT_OF_BUDGET = "not tried: the time budget ran out"
# a lever whose selection paid but whose confirmation the budget did not hold
UNCONFIRMED = "unconfirmed: not kept, not refuted"
NOT_TRIED_INTERRUPTED = "not tried: the search was interrupted (Ctrl-C)"
# a confirmation times at most this many times the selection A/Bs' steps
CONFIRM_MAX_FACTOR = 5
# the share of its time that a confirmation's estimated length may fill: the rest is slack for a
# host whose pace drifts (a confirmation cut short by its kill line confirms nothing)
CONFIRM_TIME_SHARE = 0.6
# what the confirmation of a lever that paid is given as a reserve while its group's other forms
# are tried: the estimate of an A/B of a measured stack (``again_s``, which counts no compile)
# and this share of the compiling its selection did: a confirmation re-traces the stack, and
# finds only inductor's programs cached (swin's whole-model compile on an H100: 139.5 s of
# compiling in its selection, 12.7 s in its confirmation, bench/results/tune_sweep_h100/s42)
RETRACE_SHARE = 0.1
# a selection whose CI95 holds 1 is timed once more, longer, when its point gain is at least this
UNDECIDED_MIN_GAIN = 0.02
# an alternative whose expected saving, this many times over, cannot reach the form of its group
# that paid is not tried (an audit's roofline estimate has been off by 2.8x: issue 33)
EXPECTED_SLACK = 3.0
# an error that names CUDA graphs (torch's "accessing tensor output of CUDAGraphs that has been
# overwritten by a subsequent run", its cudagraph trees' checks)
_GRAPHS_ERROR = re.compile(r"cuda ?graph", re.IGNORECASE)


@dataclass(frozen=True)
class Outcome:
    """What the search did with one lever."""

    lever: str
    kept: bool
    reason: str
    trial: int | None = None  # index of its selection A/B in SearchResult.trials
    source: str = ""  # where its expected saving came from
    confirmed_by: int | None = None  # index of its confirmation, where one ran


@dataclass(frozen=True)
class SearchResult:
    stack: Stack  # the proven stack; () when nothing pays
    proof: Trial | None  # a fresh A/B of it against the baseline, which selected none of it
    outcomes: tuple[Outcome, ...]  # every lever, tried or not, in the order considered
    trials: tuple[Trial, ...]  # every A/B, in the order run
    budget_s: float
    spent_s: float
    out_of_budget: bool
    notes: tuple[str, ...] = ()
    selected: Stack = ()  # every lever kept, each confirmed on top of those before it
    confirmed_by: int | None = None  # index of the proof in trials
    interrupted: bool = False  # Ctrl-C ended the search
    # levers whose selection paid but whose confirmation the budget cut short (or had no time
    # for): not kept, not refuted either
    unconfirmed: Stack = ()


def _ignore(_: object) -> None:
    pass


@dataclass
class _Search:
    """The search as it runs; what a Ctrl-C leaves is read from here."""

    measure: Measure
    budget_s: float
    clock: Callable[[], float]
    say: Callable[[str], None]
    on_trial: Callable[[Trial], None]
    steps: int | None
    start_s: float
    trials: list[Trial] = field(default_factory=list)
    durations_s: list[float] = field(default_factory=list)  # of each trial, by the clock
    outcomes: dict[str, Outcome] = field(default_factory=dict)
    stack: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # the A/Bs at the selection's steps, by the clock: the budget's estimate of the next ones
    selection_s: list[float] = field(default_factory=list)
    stopped: bool = False  # an A/B overran the budget: no more A/Bs
    # a lever was passed over because the time left would not hold it (the search goes on: the
    # next one may fit once a cheap confirmation has lowered the estimate of an A/B)
    passed_over: bool = False
    running: tuple[Stack, Stack, str] | None = None  # the A/B in progress, and its role
    # paid where selected, but the budget cut its confirmation short
    unconfirmed: list[str] = field(default_factory=list)
    # a group's forms are tried after the peers' later groups, each in place of the form kept, once
    # one form paid and was kept (the sides run one at a time: :func:`_substitute`)
    defer_alternatives: bool = False
    # the stack last proven against the baseline by a fresh A/B (the first lever's confirmation,
    # then a proof), that A/B's index, and what it was (in words): the answer where no later
    # stack is proven
    proven: tuple[Stack, int, str] | None = None
    refuted: set[Stack] = field(default_factory=set)  # stacks whose proof did not pay
    # a lever kept, then replaced by another form of its group: its outcome as it was kept
    replaced: dict[str, Outcome] = field(default_factory=dict)

    def left_s(self) -> float:
        return self.budget_s - (self.clock() - self.start_s)

    @property
    def typical_s(self) -> float:
        """What one more A/B is expected to take: the median of those so far. Not the longest:
        the first A/B of a compile lever pays inductor's cold compile, which the later ones,
        made of the same blocks, find in its cache (on the H200, 52.6 s against 41.9 s for the
        next whole-model compile and 8.8 s for a per-block one)."""
        return statistics.median(self.selection_s) if self.selection_s else 0.0

    @property
    def again_s(self) -> float:
        """What an A/B of a stack already measured is expected to take (a confirmation, the
        proof): the median of the confirmations so far; before any, the selections' less what
        their compiles cost. A compiled stack's programs are in inductor's cache by then (on the
        H200: a llama's compile-model selection 79 s, its confirmation 7.4 s), so the compile
        phases (parity and warm-up) are counted only as long as the timed steps."""
        again = [d for t, d in zip(self.trials, self.durations_s) if t.role == CONFIRMATION]
        if again:
            return statistics.median(again)
        if not self.selection_s:
            return 0.0
        warm = []
        for trial, duration_s in zip(self.trials, self.durations_s):
            if trial.role != SELECTION:
                continue
            phases = trial.phase_s
            compiling_s = phases.get("parity", 0.0) + phases.get("warmup", 0.0)
            warm.append(duration_s - max(0.0, compiling_s - phases.get("timed", 0.0)))
        return statistics.median(warm) if warm else self.typical_s

    def run(self, base: Stack, candidate: Stack, what: str, *, role: str = SELECTION,
            steps: int | None = None, as_run: bool = False, reserve_s: float = 0.0) -> Trial:
        """One A/B, recorded; once it is, raises KeyboardInterrupt if ab's runner ended it on
        a Ctrl-C. Its kill line is the time left less ``reserve_s`` (kept for A/Bs that must
        run after it)."""
        self.say(f"tune: {what} (A/B {len(self.trials) + 1}, {format_duration(self.left_s())} "
                 "left)")
        before = self.clock()
        self.running = (base, candidate, role)
        kill_s = max(self.left_s() - reserve_s, 1e-3)
        if as_run:
            trial = self.measure(base, candidate, kill_s, steps=steps, as_run=True)
        elif steps is None:
            trial = self.measure(base, candidate, kill_s)
        else:
            trial = self.measure(base, candidate, kill_s, steps=steps)
        trial = replace(trial, role=role)
        self.running = None
        self.trials.append(trial)
        self.durations_s.append(self.clock() - before)
        if role != AS_RUN and (steps is None or steps == self.steps):
            self.selection_s.append(self.durations_s[-1])
        if trial.out_of_time and reserve_s <= 0:  # a kill at a reserve's line leaves that time
            self.stopped = True
        self.on_trial(trial)
        if trial.interrupted:
            raise KeyboardInterrupt
        return trial

    def confirm(self, base: Stack, candidate: Stack, what: str, reserve_s: float) -> Trial:
        """A fresh A/B, with more steps where the time left less ``reserve_s`` holds them."""
        steps = _confirm_steps(self, self.left_s() - reserve_s)
        more = f", {steps} timed steps per side" if steps not in (None, self.steps) else ""
        return self.run(base, candidate, f"{what}, afresh{more}", role=CONFIRMATION,
                        steps=steps)


def search(
    ordered: Sequence[Candidate],
    measure: Measure,
    *,
    budget_s: float,
    skipped: Sequence[Skipped] = (),
    clock: Callable[[], float] = time.monotonic,
    say: Callable[[str], None] = _ignore,
    on_trial: Callable[[Trial], None] = _ignore,
    steps: int | None = None,
    defer_alternatives: bool = False,
) -> SearchResult:
    """The fastest stack of ``ordered`` that keeps parity, each lever selected and confirmed
    by A/Bs from ``measure``, the stack proven against the baseline. ``steps``: the timed steps
    of ``measure``'s A/Bs, when it takes ``steps=`` to time more (confirmations then may).
    ``defer_alternatives``: a group's first form that pays is confirmed and kept at once, and its
    other forms are tried after the peers' later groups (float8), in its place
    (:func:`_substitute`)."""
    state = _Search(measure, budget_s, clock, say, on_trial, steps, start_s=clock(),
                    defer_alternatives=defer_alternatives)
    interrupted = False
    answer: tuple[Stack, int | None] = ((), None)
    try:
        _select(ordered, state)
        answer = _as_run(state, _prove(state))
    except KeyboardInterrupt:
        interrupted = True
        _interrupted(ordered, state)
        answer = _proven(state)
    final, proof = answer
    unproven = ("the search was interrupted (Ctrl-C) before a stack with it was proven against "
                "the baseline" if interrupted else
                "no stack with it was proven against the baseline")
    for lever in state.stack:
        if lever not in final:
            kept = state.outcomes[lever]
            state.outcomes[lever] = replace(kept, kept=False,
                                            reason=f"{kept.reason}, but {unproven}")
    for lever in final:
        if not state.outcomes[lever].kept:  # replaced by a stack that was not proven
            kept = state.replaced[lever]
            state.outcomes[lever] = replace(kept, reason=f"{kept.reason}; kept: the form "
                                            f"that replaced it was confirmed, but {unproven}")
    considered = [state.outcomes[c.lever] for c in ordered if c.lever in state.outcomes]
    considered += [Outcome(s.lever, False, s.reason) for s in skipped]
    return SearchResult(
        stack=final,
        proof=state.trials[proof] if proof is not None else None,
        outcomes=tuple(considered),
        trials=tuple(state.trials),
        budget_s=budget_s,
        spent_s=clock() - state.start_s,
        out_of_budget=state.stopped or state.passed_over,
        notes=tuple(state.notes),
        selected=tuple(state.stack),
        confirmed_by=proof,
        interrupted=interrupted,
        unconfirmed=tuple(state.unconfirmed),
    )


Paid = tuple[Candidate, Trial, str, int]  # a lever whose selection paid: its trial, why, index


def _select(ordered: Sequence[Candidate], state: _Search) -> None:
    """Greedy forward selection: ``state.stack`` grows by the fastest alternative of each group
    whose increment paid, when a fresh A/B of it pays too."""
    stack, outcomes = state.stack, state.outcomes
    all_groups = groups(ordered)
    # forms tried after the peers' later groups, each with why its group's CUDA graphs failed, if
    # they did (defer_alternatives)
    deferred: list[tuple[Candidate, str | None]] = []
    # the last group of the peers' forms: their deferred forms are tried after it, before the
    # levers by evidence
    last_of_peers = max((n for n, g in enumerate(all_groups) if _of_peers(g)), default=-1)
    for number, group in enumerate(all_groups):
        paid: list[Paid] = []
        fallbacks = tuple(c.lever for c in group if c.lever in FALLBACK_FORMS)
        fallback_reserve_s = FALLBACK_SHARE * state.left_s() if fallbacks else 0.0
        graphs_failed: str | None = None  # why the step's CUDA graphs failed, once they did
        pending = list(group)
        while pending:
            candidate = pending.pop(0)
            lever = candidate.lever
            if lever in LATE_FORMS:  # last of all, in place of the form kept (_substitute)
                deferred.append((candidate, graphs_failed))
                continue
            skip = (_graphs_not_tried(lever, graphs_failed)
                    or _not_tried(lever, stack, paid, fallbacks) or _cannot_win(candidate, paid))
            if skip is not None:
                outcomes[lever] = Outcome(lever, False, skip, source=candidate.source)
                continue
            reserve_s, kept_for = _kill_reserve(state, lever, paid, fallbacks, fallback_reserve_s)
            needed_s = 0.0 if lever in fallbacks else (
                _selection_estimate_s(state, paid)
                + max(state.again_s * (2 if stack else 1), reserve_s))
            if state.stopped or state.left_s() <= 0 or state.left_s() < needed_s:
                state.passed_over = True
                outcomes[lever] = Outcome(lever, False, OUT_OF_BUDGET, source=candidate.source)
                continue
            on_top = f" on top of {','.join(stack)}" if stack else ""
            try:
                trial = state.run(tuple(stack), (*stack, lever), f"trying {lever}{on_top}",
                                  reserve_s=reserve_s)
            except KeyboardInterrupt:
                for member, _, why, index in paid:  # paid, but its group was not decided
                    outcomes[member.lever] = Outcome(
                        member.lever, False, f"{why}, but the search was interrupted (Ctrl-C) "
                        "before its alternatives were all tried", index, member.source,
                    )
                raise
            pays, why = judge(trial)
            if not pays and _undecided(trial):
                # A/Bs still to run after this one: the rest of this group and the later ones
                left = sum(len(g) for g in all_groups[number:]) - group.index(candidate) - 1
                trial, pays, why = _once_more(state, lever, on_top, trial, why, left)
            if pays:
                paid.append((candidate, trial, why, len(state.trials) - 1))
                if state.defer_alternatives and pending:
                    # decided at once; the group's other forms wait for the peers' later groups
                    _keep_fastest(state, paid, later=sum(len(g) for g in all_groups[number + 1:]))
                    paid = []
                    if lever in stack:
                        deferred += _deferred(state, lever, pending, fallbacks, graphs_failed)
                        pending = []
                continue
            outcomes[lever] = _unpaid(state, candidate, trial, why, reserve_s, kept_for, paid)
            if graphs_failed is None and (graphs_failed := _graphs_failure(lever, trial)):
                # the fallbacks record graphs too: their time goes to the form without them,
                # tried next
                fallback_reserve_s = 0.0
                pending.sort(key=lambda c: c.lever != WITHOUT_GRAPHS_FORM)
        if paid:
            _keep_fastest(state, paid, later=sum(len(g) for g in all_groups[number + 1:]))
        if number == last_of_peers:
            _substitute([d for d in deferred if d[0].lever not in LATE_FORMS], state)
            deferred = [d for d in deferred if d[0].lever in LATE_FORMS]
    _substitute(deferred, state)


def _of_peers(group: Sequence[Candidate]) -> bool:
    """Whether ``group`` holds one of the peers' forms (compile, channels-last, float8)."""
    return any(candidate.lever in PEER_FORMS for candidate in group)


def _deferred(state: _Search, kept: str, pending: Sequence[Candidate],
              fallbacks: Sequence[str], graphs_failed: str | None
              ) -> list[tuple[Candidate, str | None]]:
    """The forms of a group still to try once ``kept`` was kept, deferred until after the later
    groups (a peer's form: the later peers' groups) with why the group's CUDA graphs failed, if
    they did; its fallbacks are not tried."""
    out = []
    for candidate in pending:
        if candidate.lever in fallbacks:
            state.outcomes[candidate.lever] = Outcome(
                candidate.lever, False, _only_fallback(kept), source=candidate.source)
        else:
            out.append((candidate, graphs_failed))
    return out


def _substitute(deferred: Sequence[tuple[Candidate, str | None]], state: _Search) -> None:
    """Each deferred form tried in place of the form of its group that the stack holds: an A/B
    of the stack with it there against the stack as it is, then a fresh one, as an increment is
    confirmed; the stack then holds it, and the proof is of the stack as it ends.

    Where each A/B builds and times its sides one at a time, the budget holds few of them, and
    trying every form of the first group before the later groups spent it on forms a few percent
    apart: on ministral3 (H100, s52: 8 x 2048, a 3-minute budget) the three compile forms took
    85 s for 1.298x, 1.339x and 1.349x, float8 on top of the whole-model form 56.5 s to select
    (its recompile) and 27.5 s to confirm, and the stack was never proven: the answer was the
    compile form alone (0.960 of torchtitan's float8 on per-layer compile). Deferred, the first
    form that pays (per-block compile, its recompile the cheaper) carries the later groups, and
    the whole-model forms are tried in its place with the time that is left. The stack is
    proven against the baseline before the first of them runs: where a replacement is not
    proven in the time, the answer is that stack, not the first lever alone."""
    failed: str | None = None  # why a replacement's CUDA graphs failed, once one's did
    for number, (candidate, graphs_failed) in enumerate(deferred):
        lever = candidate.lever
        stack = tuple(state.stack)
        current = next((kept for kept in stack if exclusive_with(lever, [kept])), None)
        rest = [kept for kept in stack if kept != current]
        # (where no lever of the stack excludes it, it goes on top: a lever of the group that
        # clashed with another of its forms, not with the one kept)
        skip = ((_late_not_tried(lever, current) if lever in LATE_FORMS else None)
                or _graphs_not_tried(lever, graphs_failed or failed)
                or _not_tried(lever, rest, (), ())
                or _cannot_replace(state, candidate, current) or _refuted(state, stack))
        if skip is None:
            # its A/B, its confirmation and the proof of the stack it would change, after the
            # proof of the stack as it is where that is still to run
            unproven = stack != _proven(state)[0]
            needed_s = state.typical_s + (3 if unproven else 2) * state.again_s
            if state.stopped or state.left_s() <= 0 or state.left_s() < needed_s:
                state.passed_over = True
                skip = OUT_OF_BUDGET
            elif unproven:
                _prove(state)
                skip = _refuted(state, stack)
        if skip is not None:
            state.outcomes[lever] = Outcome(lever, False, skip, source=candidate.source)
            continue
        if current is None:
            where = f" on top of {','.join(stack)}"
        else:
            where = f" in place of {current}" + (f" in {','.join(stack)}" if rest else "")
        trial = state.run(stack, _placed(stack, lever, current), f"trying {lever}{where}")
        pays, why = judge(trial)
        if not pays and _undecided(trial):
            trial, pays, why = _once_more(state, lever, where, trial, why,
                                          left=len(deferred) - number - 1)
        if not pays:
            state.outcomes[lever] = Outcome(lever, False, why, len(state.trials) - 1,
                                            candidate.source)
            failed = failed or _graphs_failure(lever, trial)
            continue
        _confirm_increment(state, (candidate, trial, why, len(state.trials) - 1),
                           state.again_s, replaces=current)


def _not_tried(lever: str, stack: Sequence[str], paid: Sequence[Paid],
               fallbacks: Sequence[str]) -> str | None:
    """Why ``lever`` is not tried on top of ``stack``, or None: a fallback form once another
    form of its group paid (another fallback too), an alternative of a lever kept, a lever a
    kept one covers."""
    if lever in fallbacks and paid:
        return _only_fallback(_fastest(paid)[0].lever)
    clash = exclusive_with(lever, stack)
    if clash is not None:
        return f"not tried: it does not stack with {clash}, which was kept"
    cover = covered_by(lever, stack)
    if cover is not None:
        return f"not tried: {cover}, which was kept, already does what it does"
    return None


def _placed(stack: Stack, lever: str, replaces: str | None) -> Stack:
    """``stack`` with ``lever`` in the place of ``replaces``, or on top where that is None."""
    if replaces is None:
        return (*stack, lever)
    return tuple(lever if kept == replaces else kept for kept in stack)


def _refuted(state: _Search, stack: Stack) -> str | None:
    """Why no form is tried in a place of ``stack``: its proof against the baseline did not
    pay; None where it did not fail."""
    if stack not in state.refuted:
        return None
    return (f"not tried: the stack {','.join(stack)} it would change was not proven against "
            "the baseline")


def _cannot_replace(state: _Search, candidate: Candidate, current: str | None) -> str | None:
    """Why a deferred form is not tried in place of ``current``, the form kept: what that one
    paid where it was selected, its expected saving thrice over could not reach
    (:func:`_cannot_win`; Liger's kernels, a form of compile's group, took 122 s of a 3-minute
    budget on the zoo's mixtral to run 0.566x where compile had paid 1.66x: H100, s51)."""
    kept = state.outcomes.get(current) if current is not None else None
    if kept is None or kept.trial is None:
        return None
    kept_candidate = Candidate(kept.lever, None, kept.source)
    return _cannot_win(candidate, [(kept_candidate, state.trials[kept.trial], "", kept.trial)])


def _late_not_tried(lever: str, current: str | None) -> str | None:
    """Why a late form (:data:`LATE_FORMS`: a compile lever's autotuned form) is not tried in
    place of ``current``, the form of its group the stack holds: none was kept, or the one kept
    is another lever's (per-block compile kept, the whole model's autotuned form); None where it
    is tried."""
    ident = lever_id_of(lever)
    if current is None:
        return (f"not tried: no other form of {ident} paid here, and this one compiles the same "
                "program, for longer (its autotuning)")
    if lever_id_of(current) != ident:
        return (f"not tried: {current} was kept, not a form of {ident}, and this form autotunes "
                f"{ident}'s program")
    return None


def _only_fallback(paid: str) -> str:
    """Why a group's fallback form is not tried once ``paid``, another of its forms, paid."""
    return (f"not tried: {paid} paid, and this form is only a fallback where no other form "
            "pays in the time")


def _graphs_failure(lever: str, trial: Trial) -> str | None:
    """Why ``lever``'s CUDA graphs failed on this step, where ``trial`` stopped on them: a form
    that records the step as CUDA graphs raised an error that names them."""
    said = trial.killed or trial.error or ""
    if lever not in GRAPH_FORMS or not _GRAPHS_ERROR.search(said):
        return None
    first = said.splitlines()[0]  # torch's message goes on with a stack trace
    shown = first if len(first) <= 160 else f"{first[:160].rstrip()}..."
    return f"{lever}'s CUDA graphs failed on this step ({shown})"


def _graphs_not_tried(lever: str, graphs_failed: str | None) -> str | None:
    """Why a form that records CUDA graphs is not tried once a form's graphs failed."""
    if graphs_failed is None or lever not in GRAPH_FORMS:
        return None
    return f"not tried: {graphs_failed}, and this form records the same graphs"


def _cannot_win(candidate: Candidate, paid: Sequence[Paid]) -> str | None:
    """Why an alternative is not tried once another form of its group paid more than it could:
    even :data:`EXPECTED_SLACK` times its expected saving would leave it slower than the one
    that paid, and a group keeps only its fastest (Liger's kernels, expected 3% of a step, took
    122 s of a 3-minute budget on the zoo's mixtral where whole-model compile had paid 1.66x:
    H100, s51). The peers' forms are tried whatever their estimate: the estimates are the
    search's weakest evidence, and those forms are what the answer is compared with."""
    if (not paid or candidate.expected is None or candidate.lever in PEER_FORMS
            or candidate.lever in LATE_FORMS):
        return None
    best, best_trial = _fastest(paid)[:2]
    could = 1.0 + EXPECTED_SLACK * max(candidate.expected, 0.0)
    if could >= speed_of(best_trial):
        return None
    return (f"not tried: {best.lever} paid {speed_of(best_trial):.3f}x where selected, and this "
            f"alternative, expected to save {100 * candidate.expected:.3g}% of the step "
            f"({candidate.source}), would still be slower at {EXPECTED_SLACK:g} times that "
            f"({could:.3f}x): the group keeps its fastest")


def _selection_estimate_s(state: _Search, paid: Sequence[Paid]) -> float:
    """What the next selection A/B is expected to take: the median so far, or, once a form of
    its group paid, at least as long as that form's selection (forms of one lever compile alike:
    on ministral3 (H100, s51) float8-rowwise, given the median selection's 27 s after float8's
    had taken 42 s, ran into the time of float8's confirmation and the stack's proof)."""
    longest = max((state.durations_s[index] for *_, index in paid), default=0.0)
    return max(state.typical_s, longest)


def _kill_reserve(state: _Search, lever: str, paid: Sequence[Paid], fallbacks: Sequence[str],
                  fallback_reserve_s: float) -> tuple[float, str | None]:
    """The time this A/B's kill line keeps for what must follow it, and the fallback forms where
    that is their time (None where it is a paid form's confirmation, or nothing).

    Once an alternative of the group paid, its confirmation (and the proof once the stack would
    hold two levers) is kept out of this A/B's time: at 3dad68e on T5 (H100) an alternative
    given all the time left ran out of it, and the whole-model compile that had paid 2.96x went
    unconfirmed. Until a form paid, the others keep the fallbacks' time (a first compile that
    would take it all is stopped inside its step), and the fallbacks, which compile in seconds,
    are tried in whatever is left (the first keeps nothing for the second). Not the end of the search: the A/B's own estimate
    is the median A/B so far, which the first (cold) compile holds high until a confirmation,
    its programs cached, brings it down."""
    if lever not in fallbacks and not paid and fallback_reserve_s > 0:
        return fallback_reserve_s, " and ".join(fallbacks)
    return (_paid_reserve_s(state, paid) if paid else 0.0), None


def _once_more(state: _Search, lever: str, on_top: str, first: Trial, why: str,
               left: int) -> tuple[Trial, bool, str]:
    """An A/B whose CI was too wide to tell (``first``: a step whose times jitter) run once
    more, longer, where the time left holds it beside the ``left`` A/Bs still to run; else
    ``first`` as it was judged. ``on_top`` says where ``lever`` goes: on top of the stack, or
    `` in place of ...`` (the form of its group it replaces)."""
    stack = tuple(state.stack)
    reserve_s = left * state.typical_s + state.again_s * (2 if stack else 1)
    more = _confirm_steps(state, state.left_s() - reserve_s)
    if more is None or more <= (state.steps or 0):
        return first, False, why
    trial = state.run(
        stack, first.stack,
        f"trying {lever}{on_top} again, {more} timed steps per side (the "
        f"first {why.removeprefix('does not pay: ')})", steps=more, reserve_s=reserve_s,
    )
    pays, why = judge(trial)
    return trial, pays, why


def _unpaid(state: _Search, candidate: Candidate, trial: Trial, why: str, reserve_s: float,
            kept_for: str | None, paid: Sequence[Paid]) -> Outcome:
    """The outcome of a lever that did not pay, saying what its kill line kept time for where
    it ran out of time: the fallbacks ``kept_for`` (with a note of the budget that gives the
    form longer), or the confirmation of an alternative that paid."""
    lever, index = candidate.lever, len(state.trials) - 1
    if trial.out_of_time and kept_for is not None:
        state.notes.append(
            f"{lever} did not finish in the {format_duration(state.durations_s[-1])} "
            f"it was given (a first step compiles the model); a --budget of "
            f"{format_duration(2 * state.budget_s)} or more gives it longer"
        )
        return Outcome(
            lever, False, f"{why} (its kill line kept {format_duration(reserve_s)} for "
            f"{kept_for}, tried where no form of the group pays in the time)", index,
            candidate.source,
        )
    if trial.out_of_time and reserve_s > 0:
        return Outcome(
            lever, False, f"{why} (its kill line kept {format_duration(reserve_s)} for the "
            f"confirmation of {_fastest(paid)[0].lever}, which paid)", index, candidate.source,
        )
    return Outcome(lever, False, why, index, candidate.source)


def _keep_fastest(state: _Search, paid: Sequence[Paid], later: int) -> None:
    """Of a group's alternatives that paid, the fastest confirmed (:func:`_confirm_increment`),
    the others said to have paid less; ``later`` selections may run after it, then the proof."""
    best = _fastest(paid)
    for candidate, trial, why, index in paid:
        if candidate is not best[0]:
            state.outcomes[candidate.lever] = Outcome(
                candidate.lever, False,
                f"{why}, but its alternative {best[0].lever} paid more "
                f"({speed_of(best[1]):.3f}x against {speed_of(trial):.3f}x)",
                index, candidate.source,
            )
    after = later + (1 if state.stack or later else 0)
    _confirm_increment(state, best, after * state.typical_s)


def _fastest(paid: Sequence[Paid]) -> Paid:
    """Of a group's alternatives that paid, the fastest: the one to confirm."""
    return max(paid, key=lambda p: speed_of(p[1]))


def _paid_reserve_s(state: _Search, paid: Sequence[Paid]) -> float:
    """The time kept, while a group's other forms are tried, for the confirmation of the one
    that paid most and, once the stack holds a lever, the proof after it."""
    trial = _fastest(paid)[1]
    compiling_s = trial.phase_s.get("parity", 0.0) + trial.phase_s.get("warmup", 0.0)
    return state.again_s * (2 if state.stack else 1) + RETRACE_SHARE * compiling_s


def _confirm_increment(
    state: _Search, best: tuple[Candidate, Trial, str, int], reserve_s: float,
    replaces: str | None = None,
) -> None:
    """Keep the lever that ``best`` selected when a fresh A/B of the same increment pays: on
    top of the stack, or in place of its form ``replaces``."""
    candidate, _, why, index = best
    lever, base = candidate.lever, tuple(state.stack)
    stacked = _placed(base, lever, replaces)
    if replaces is not None:
        on_top = f" in place of {replaces}"
    else:
        on_top = f" on top of {','.join(base)}" if base else " against the baseline"
    # the time the search would have needed to confirm it: what it spent, and an A/B of a
    # measured stack as estimated before this one (a killed confirmation's time says less)
    needed_s = state.budget_s - state.left_s() + state.again_s
    if state.left_s() <= 0:
        state.outcomes[lever] = Outcome(
            lever, False, f"{why}, but no time was left to confirm it by a fresh A/B "
            f"({UNCONFIRMED})", index, candidate.source,
        )
        _unconfirmed(state, lever, why, needed_s)
        return
    try:
        trial = state.confirm(base, stacked, f"confirming {lever}{on_top}", reserve_s)
    except KeyboardInterrupt:
        state.outcomes[lever] = Outcome(
            lever, False, f"{why}, but the search was interrupted (Ctrl-C) during its "
            "confirmation", index, candidate.source, len(state.trials) - 1,
        )
        raise
    pays, confirmed = judge(trial)
    conf = len(state.trials) - 1
    if pays:
        state.stack[:] = stacked
        if not base:
            state.proven = ((lever,), conf, "its confirmation")
        where = f" in place of {replaces}" if replaces is not None else ""
        state.outcomes[lever] = Outcome(
            lever, True, f"{why}{where}; confirmed by a fresh A/B (A/B {conf + 1}): "
            f"{confirmed.removeprefix('pays: ')}", index, candidate.source, conf,
        )
        if replaces is not None:
            before = state.replaced[replaces] = state.outcomes[replaces]
            state.outcomes[replaces] = replace(
                before, kept=False, reason=f"{before.reason}; then replaced by {lever}, which "
                f"paid {speed_of(trial):.3f}x in its place (A/B {conf + 1})",
            )
    elif trial.out_of_time:
        state.outcomes[lever] = Outcome(
            lever, False, f"{why}, but the budget ran out during its confirmation (A/B "
            f"{conf + 1}: {trial.killed}) ({UNCONFIRMED})", index, candidate.source, conf,
        )
        _unconfirmed(state, lever, why, needed_s)
    else:
        state.outcomes[lever] = Outcome(
            lever, False, f"{why}, but a fresh A/B (A/B {conf + 1}) did not confirm it: "
            f"{confirmed}", index, candidate.source, conf,
        )


def _unconfirmed(state: _Search, lever: str, why: str, needed_s: float) -> None:
    """``lever`` paid where it was selected (``why``), but the budget held no confirmation of
    it: it is not kept (a selection is no proof), and a note says what it paid and the budget
    that would give its confirmation time (``needed_s``, the time spent before it and the
    confirmation's estimate, with a quarter more for slack; in whole minutes)."""
    state.unconfirmed.append(lever)
    minutes = 60.0 * math.ceil(1.25 * needed_s / 60.0)
    budget = format_duration(max(minutes, state.budget_s + 60.0))
    state.notes.append(
        f"{lever} paid where it was selected ({why.removeprefix('pays: ')}), but the budget ran "
        f"out before a fresh A/B could confirm it: it is not kept, and not refuted either; a "
        f"--budget of {budget} or more gives its confirmation time"
    )


def _prove(state: _Search) -> tuple[Stack, int | None]:
    """(the answer, the index of its proof): the stack when a fresh A/B of it against the
    baseline pays (or one already did); else the stack proven before it (the first lever kept,
    which its confirmation proved, or a stack proven before a form replaced one of its own)."""
    stack = tuple(state.stack)
    if state.proven is None or stack == state.proven[0] or stack in state.refuted:
        return _proven(state)
    shown = ",".join(stack)
    before, _, proved_by = state.proven
    if state.left_s() <= 0:
        state.notes.append(
            f"no time was left to prove the stack {shown} against the baseline; the answer is "
            f"{','.join(before)}, which {proved_by} proved (raise --budget to prove the stack)"
        )
        return _proven(state)
    trial = state.confirm((), stack, f"proving {shown} against the baseline", 0.0)
    pays, why = judge(trial)
    if pays:
        state.proven = (stack, len(state.trials) - 1, f"its proof (A/B {len(state.trials)})")
        return _proven(state)
    state.refuted.add(stack)
    state.notes.append(
        f"the stack {shown} against the baseline (A/B {len(state.trials)}): {why}; the answer "
        f"is {','.join(before)}, which {proved_by} proved against the baseline"
    )
    return _proven(state)


def _as_run(state: _Search, answer: tuple[Stack, int | None]) -> tuple[Stack, int | None]:
    """The answer timed again as the user runs it, where its proof timed the programs its
    parity steps compiled (``timed_eager_random``) and the time left holds one more cold
    compile (as long as the longest A/B so far). That A/B, fresh and against the baseline,
    becomes the proof when it pays; when it ran to its end and does not, nothing is proven as
    the user runs it and the answer is none; when it was stopped, the proof stands, with a
    note."""
    stack, proof = answer
    if not stack or proof is None or not state.trials[proof].timed_eager_random:
        return answer
    shown = ",".join(stack)
    drawn = ("its proof timed the programs its parity steps compiled, random numbers drawn as "
             "eager draws them")
    need_s = max(state.durations_s)
    if state.left_s() < need_s:
        state.notes.append(
            f"{shown}: {drawn}; no time was left to time it again as you run it (about "
            f"{format_duration(need_s)}: raise --budget, or run the levers ab command below)"
        )
        return answer
    steps = state.trials[proof].num_steps if state.steps is not None else None
    trial = state.run((), stack, f"timing {shown} against the baseline as you run it (compiled "
                      "again, inductor drawing its own random numbers)", role=AS_RUN,
                      steps=steps, as_run=True)
    pays, why = judge(trial)
    index = len(state.trials) - 1
    if pays:
        return stack, index
    if trial.killed is not None or trial.error is not None:
        state.notes.append(f"{shown}: {drawn}; timed again as you run it (A/B {index + 1}), "
                           f"{why}: the proof stands on the programs its parity steps compiled")
        return answer
    state.notes.append(f"{shown} paid where {drawn}, but timed again as you run it (A/B "
                       f"{index + 1}): {why}; nothing is proven as you run it")
    return (), None


def _proven(state: _Search) -> tuple[Stack, int | None]:
    """The stack last proven against the baseline (the first lever kept, by its confirmation;
    a larger one, by its proof) and that A/B's index; none before a lever is kept."""
    if state.proven is None:
        return (), None
    stack, index, _ = state.proven
    return stack, index


def _undecided(trial: Trial) -> bool:
    """An A/B that ran to its end with parity whose tokens/s CI95 holds 1 while its point
    estimate is a gain worth a longer look (at least :data:`UNDECIDED_MIN_GAIN`)."""
    if trial.error or trial.killed or trial.parity != PARITY or trial.tokens_differ:
        return False
    if trial.tokens_per_s_ratio is None or trial.tokens_per_s_ci95 is None:
        return False
    low, high = trial.tokens_per_s_ci95
    return low <= 1.0 < high and trial.tokens_per_s_ratio >= 1.0 + UNDECIDED_MIN_GAIN


def _confirm_steps(state: _Search, time_s: float) -> int | None:
    """The timed steps per side of a confirmation given ``time_s``: the selection A/Bs' own
    (``state.steps``), or more where ``time_s`` holds them at the pace of the A/Bs so far; None
    when ``measure`` takes no steps."""
    if state.steps is None:
        return None
    pair_s, fixed_s = 0.0, 0.0
    for trial, duration_s in zip(state.trials, state.durations_s):
        if trial.step_ms is None:
            continue
        # a pair of timed steps (one of each side), and the rest of the A/B (builds, parity,
        # warm-up): the largest seen of each
        pair = sum(trial.step_ms) / 1e3
        pair_s = max(pair_s, pair)
        steps = trial.timed_steps or trial.num_steps or state.steps
        fixed_s = max(fixed_s, duration_s - steps * pair)
    if pair_s <= 0:
        return state.steps
    fits = math.floor((time_s * CONFIRM_TIME_SHARE - fixed_s) / pair_s)
    return min(max(fits, state.steps), state.steps * CONFIRM_MAX_FACTOR)


def _interrupted(ordered: Sequence[Candidate], state: _Search) -> None:
    """After a Ctrl-C: the A/B it stopped is among the trials (ab's runner returns one marked
    interrupted; an interrupt outside its steps leaves one made here), and the levers not
    reached say so."""
    if state.running is not None:
        base, stack, role = state.running
        state.running = None
        trial = Trial(base=base, stack=stack, decision=KILLED, killed="interrupted (Ctrl-C)",
                      killed_kind=INTERRUPTED_KIND, role=role)
        state.trials.append(trial)
        state.on_trial(trial)
    last = state.trials[-1] if state.trials else None
    for candidate in ordered:
        lever = candidate.lever
        if lever in state.outcomes:
            continue
        # the lever a selection tried: on top of its base, or in place of one of its levers
        if last is not None and last.role == SELECTION and lever in last.stack and (
                lever not in last.base):
            state.outcomes[lever] = Outcome(
                lever, False, judge(last)[1], len(state.trials) - 1, candidate.source
            )
        else:
            state.outcomes[lever] = Outcome(
                lever, False, NOT_TRIED_INTERRUPTED, source=candidate.source
            )
    stopped = last is not None and last.interrupted
    state.notes.append(
        f"the search was interrupted (Ctrl-C) during A/B {len(state.trials)}, kept as far as "
        "it ran" if stopped else
        f"the search was interrupted (Ctrl-C) after {len(state.trials)} A/B(s)"
    )
