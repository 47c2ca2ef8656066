"""A fake A/B for the search: each lever has a speed factor and a parity verdict; a stack's
speed is the product of its levers' factors, and the clock advances a fixed time per A/B."""

from __future__ import annotations

from dataclasses import dataclass, field

from levers.tune.candidates import Candidate
from levers.tune.trial import Trial, failed


@dataclass
class Clock:
    now_s: float = 0.0

    def __call__(self) -> float:
        return self.now_s


@dataclass
class FakeAb:
    speed: dict[str, float]  # lever -> tokens/s factor it brings (1.0 when not named)
    clock: Clock = field(default_factory=Clock)
    cost_s: float = 10.0  # clock time one A/B takes
    costs_s: tuple[float, ...] = ()  # the clock time of the first A/Bs, in order, where named
    damaged: frozenset[str] = frozenset()  # levers that fail parity
    broken: dict[str, str] = field(default_factory=dict)  # lever -> why it cannot be built
    # stack -> its speed against the baseline, where the increments' gains do not add up
    together: dict[tuple[str, ...], float] = field(default_factory=dict)
    # stack -> its ratio over its base from its second A/B on (the first one paid by noise)
    again: dict[tuple[str, ...], float] = field(default_factory=dict)
    # stack -> the half width of its CI95 at 20 timed steps (0.01 when not named), narrowing
    # as one over the square root of the steps
    wide: dict[tuple[str, ...], float] = field(default_factory=dict)
    calls: list[tuple[tuple[str, ...], tuple[str, ...]]] = field(default_factory=list)
    steps_asked: list[int | None] = field(default_factory=list)  # steps= of each call
    # levers whose trials timed the parity steps' programs (random drawn as eager draws them)
    eager_random: frozenset[str] = frozenset()
    # stack -> its ratio against the baseline timed as the user runs it (as_run=True)
    as_run: dict[tuple[str, ...], float] = field(default_factory=dict)
    as_run_asked: list[tuple[str, ...]] = field(default_factory=list)
    # stack -> (clock time, of which compiling) of its first A/B, a cold compile: the parity
    # phase a real A/B records; the rest is its timed steps. Its later A/Bs take cost_s
    cold_s: dict[tuple[str, ...], tuple[float, float]] = field(default_factory=dict)
    # an A/B that would outlast the kill line it is given is stopped there, as ab's runner does
    kills: bool = False
    # lever -> the error its candidate's parity step raised: the A/B is stopped there, after
    # its time (a compile's, where cold_s names one), as ab's runner stops a step that raises
    raises: dict[str, str] = field(default_factory=dict)

    def factor(self, stack: tuple[str, ...]) -> float:
        out = 1.0
        for lever in stack:
            out *= self.speed.get(lever, 1.0)
        return out

    def __call__(self, base, stack, time_budget_s, *, steps=None, as_run=False):
        self.calls.append((tuple(base), tuple(stack)))
        if as_run:
            self.as_run_asked.append(tuple(stack))
        self.steps_asked.append(steps)
        nth = len(self.calls) - 1
        cost_s = self.costs_s[nth] if nth < len(self.costs_s) else self.cost_s
        first = self.calls.count(self.calls[-1]) == 1
        cost_s, compiling = self.cold_s.get(tuple(stack), (cost_s, 0.0)) if first else (cost_s, 0.0)
        if self.kills and time_budget_s is not None and cost_s > time_budget_s:
            self.clock.now_s += time_budget_s
            return Trial(base=tuple(base), stack=tuple(stack), decision="KILLED",
                         killed=f"time budget of {time_budget_s:g} s spent",
                         killed_kind="time_budget", wall_s=time_budget_s)
        self.clock.now_s += cost_s
        raised = next((self.raises[lever] for lever in stack if lever in self.raises), None)
        if raised is not None:
            return Trial(base=tuple(base), stack=tuple(stack), decision="KILLED",
                         killed=f"candidate parity step 2 raised {raised}",
                         killed_kind="step_error", wall_s=cost_s,
                         phase_s={"parity": compiling or cost_s})
        for lever in stack:
            if lever in self.broken:
                return failed(base, stack, self.broken[lever])
        ratio = self.factor(tuple(stack)) / self.factor(tuple(base))
        if not base and tuple(stack) in self.together:
            ratio = self.together[tuple(stack)]
        if tuple(stack) in self.again and self.calls.count(self.calls[-1]) > 1:
            ratio = self.again[tuple(stack)]
        if as_run and tuple(stack) in self.as_run:
            ratio = self.as_run[tuple(stack)]
        bad = any(lever in self.damaged for lever in stack)
        half = self.wide.get(tuple(stack), 0.01) * (20 / (steps or 20)) ** 0.5
        return Trial(
            base=tuple(base),
            stack=tuple(stack),
            decision="DAMAGED" if bad else "IMPROVED",
            tokens_per_s_ratio=ratio,
            tokens_per_s_ci95=(ratio - half, ratio + half),
            step_time_ratio=1 / ratio,
            step_time_ci95=(1 / (ratio + half), 1 / (ratio - half)),
            step_ms=(10.0, 10.0 / ratio),
            parity="DAMAGED" if bad else "PARITY",
            parity_note="loss after step 2 differs by 0.5 (tolerance 0.02)" if bad else "ok",
            wall_s=self.cost_s,
            num_steps=steps,
            timed_eager_random=not as_run and any(lever in self.eager_random for lever in stack),
            phase_s={"parity": compiling, "timed": cost_s - compiling},
        )


def ordered(*ids: str) -> list[Candidate]:
    return [Candidate(lever, None, "test") for lever in ids]
