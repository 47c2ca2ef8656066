"""One trial of the search: a paired A/B of a stack of levers against a smaller one, as data.

A :class:`Trial` keeps what the search and the report read from ab's
:class:`levers.ab.runner.AbResult` (the ratios with their CI95, parity, quality, peak memory, a
kill or an error), in plain values that go into the record as they are. :func:`judge` is the one
rule for whether adding the levers paid.

``Measure`` is the A/B the search calls: ``measure(base, stack, time_budget_s)`` compares
``stack`` (the candidate) with ``base`` (the baseline, ``()`` for the workload as given), both
built from the workload; the real one is :func:`levers.tune.measure.ab_measure`, tests pass a
fake. The search asks a confirmation for its number of timed steps per side with ``steps=``,
only where its caller says the measure takes it (:func:`levers.tune.search.search`'s
``steps``); such an A/B is always run afresh. ``as_run=True`` (asked only after a trial that
said ``timed_eager_random``) times the programs as the user runs them: compiled again after the
parity steps, inductor drawing its own random numbers.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from levers.ab.looks import timed_pairs
from levers.ab.verdict import DAMAGED, NOT_MEASURED, PARITY
from levers.levers.lever import lever_id_of, parse_lever_spec

Stack = tuple[str, ...]
# what a trial was for: selecting a lever (an increment over the stack so far), or confirming a
# selected stack against the baseline by a fresh A/B that selected none of its levers
SELECTION = "selection"
CONFIRMATION = "confirmation"
# the levers that compile the model, by default with inductor, whose programs draw their own
# random numbers unless inductor's fallback_random is on while they compile
COMPILE_LEVERS = ("compile-model", "compile-blocks")
# the proven stack timed again against the baseline as the user runs it, where the proof timed
# the programs its parity steps compiled (random numbers drawn as eager draws them)
AS_RUN = "as-run"
INTERRUPTED_KIND = "interrupted"  # ab's kill kind for Ctrl-C (levers.ab.killlines.KINDS)


class Measure(Protocol):
    def __call__(
        self, base: Stack, stack: Stack, time_budget_s: float | None, *, steps: int | None = None,
        as_run: bool = False,
    ) -> Trial: ...


@dataclass(frozen=True)
class Trial:
    """One A/B: ``stack`` against ``base``; every ratio is candidate over baseline."""

    base: Stack
    stack: Stack
    decision: str  # ab's one word: IMPROVED / PARITY / DAMAGED / KILLED / N/A, or "FAILED"
    tokens_per_s_ratio: float | None = None
    tokens_per_s_ci95: tuple[float, float] | None = None
    step_time_ratio: float | None = None
    step_time_ci95: tuple[float, float] | None = None
    parity: str = NOT_MEASURED
    parity_note: str = ""
    quality: str = NOT_MEASURED
    quality_note: str = ""
    step_ms: tuple[float, float] | None = None  # median step times (baseline, candidate)
    peak_allocated_bytes: tuple[float, float] | None = None  # medians (baseline, candidate)
    peak_verdict: str = NOT_MEASURED
    killed: str | None = None  # the kill line's reason
    killed_kind: str | None = None  # "time_budget", "step_error", ...
    error: str | None = None  # the stack could not be built (a lever does not apply, raised)
    wall_s: float = 0.0
    warnings: tuple[str, ...] = ()
    # the sides process different tokens per step (raise-batch): judged per token, as ab judges
    # it; one-step parity and step time differ by design and are shown, not judged
    tokens_differ: bool = False
    # seconds of each phase of the A/B (reference, build, parity, warmup, timed, quality)
    phase_s: dict[str, float] = field(default_factory=dict)
    role: str = SELECTION  # SELECTION or CONFIRMATION, set by the search
    num_steps: int | None = None  # timed steps per side it was asked for, where the A/B says
    # timed steps per side it ran: fewer where an interim look found the ratio decided
    # (levers.ab.looks); None where the A/B says nothing of them
    timed_steps: int | None = None
    # its timed steps ran the programs its parity steps compiled, with eager's random draws
    # (AbConfig.time_parity_programs on a step that draws random numbers in a compiled model)
    timed_eager_random: bool = False
    # every timed step's time (ms) of each side (baseline, candidate), in the order they ran:
    # the record's evidence of a drift within a side's steps or between the sides' blocks
    # (glm_moe_dsa's first one-at-a-time baseline, H100 s51: 1199 ms a step at the median, its
    # second 1101 ms)
    step_ms_each: tuple[tuple[float, ...], tuple[float, ...]] | None = None
    ab: Any = field(default=None, repr=False, compare=False)  # the AbResult, when there is one

    @property
    def added(self) -> Stack:
        return tuple(lever for lever in self.stack if lever not in self.base)

    @property
    def saved_ms(self) -> float | None:
        """Median step time saved per step (negative when the candidate is slower); for sides
        of different tokens per step, the baseline's step time saved at the candidate's
        tokens/s."""
        if self.step_ms is None:
            return None
        if self.tokens_differ and self.tokens_per_s_ratio:
            return self.step_ms[0] * (1.0 - 1.0 / self.tokens_per_s_ratio)
        return self.step_ms[0] - self.step_ms[1]

    @property
    def out_of_time(self) -> bool:
        return self.killed_kind == "time_budget"

    @property
    def interrupted(self) -> bool:
        return self.killed_kind == INTERRUPTED_KIND

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("ab")
        data["pays"], data["why"] = judge(self)
        return data


def _ci_words(ratio: float, ci: tuple[float, float], what: str) -> str:
    return f"{what} {ratio:.3f}x [{ci[0]:.3f}, {ci[1]:.3f}]"


def judge(trial: Trial) -> tuple[bool, str]:
    """(paid, why): paid only when the A/B ran to its end, parity held (and quality did not
    drop), and the CI95 of the tokens/s ratio lies above 1 (of the step-time ratio below 1 when
    the workload counts no tokens). Sides of different tokens per step (raise-batch) are judged
    per token, as ab judges them: tokens/s and quality, not one-step parity."""
    if trial.error is not None:
        return False, trial.error
    if trial.killed is not None:
        return False, f"the A/B was stopped: {trial.killed}"
    if trial.parity != PARITY and not trial.tokens_differ:
        why = "failed parity" if trial.parity == DAMAGED else "parity could not be checked"
        return False, f"{why} ({trial.parity_note})" if trial.parity_note else why
    if trial.quality == DAMAGED:
        return False, f"quality dropped ({trial.quality_note})"
    if trial.tokens_per_s_ci95 is not None and trial.tokens_per_s_ratio is not None:
        words = _ci_words(trial.tokens_per_s_ratio, trial.tokens_per_s_ci95, "tokens/s")
        low, high = trial.tokens_per_s_ci95
        if low > 1.0:
            return True, f"pays: {words}"
        return False, f"slower: {words}" if high < 1.0 else f"does not pay: {words} holds 1"
    if trial.step_time_ci95 is not None and trial.step_time_ratio is not None:
        words = _ci_words(trial.step_time_ratio, trial.step_time_ci95, "step time")
        low, high = trial.step_time_ci95
        if high < 1.0:
            return True, f"pays: {words}"
        return False, f"slower: {words}" if low > 1.0 else f"does not pay: {words} holds 1"
    return False, "not timed"


def speed_of(trial: Trial) -> float:
    """The point speed-up, for choosing between alternatives that both paid."""
    if trial.tokens_per_s_ratio is not None:
        return trial.tokens_per_s_ratio
    if trial.step_time_ratio:
        return 1.0 / trial.step_time_ratio
    return 0.0


def failed(base: Stack, stack: Stack, error: str, wall_s: float = 0.0) -> Trial:
    return Trial(base=base, stack=stack, decision="FAILED", error=error, wall_s=wall_s)


def from_ab(base: Stack, stack: Stack, result: Any) -> Trial:
    """The trial an :class:`levers.ab.runner.AbResult` says."""

    def ratio(name: str) -> tuple[float | None, tuple[float, float] | None]:
        read = result.read(name)
        if read.ci is None:
            return None, None
        return read.ci.ratio, (read.ci.lo, read.ci.hi)

    tokens, tokens_ci = ratio("tokens_per_s")
    step, step_ci = ratio("step_time")
    parity = result.read("parity")
    peak = result.read("peak_allocated")
    peaks = None
    if peak.baseline is not None and peak.candidate is not None:
        peaks = (peak.baseline.median, peak.candidate.median)
    timed = result.read("step_time")
    step_ms = None
    if timed.baseline is not None and timed.candidate is not None:
        step_ms = (timed.baseline.median, timed.candidate.median)
    quality = result.quality
    sides = (result.baseline, result.candidate)
    per_step = [getattr(side, "tokens_per_step", None) for side in sides]
    return Trial(
        base=base,
        stack=stack,
        decision=result.decision,
        tokens_per_s_ratio=tokens,
        tokens_per_s_ci95=tokens_ci,
        step_time_ratio=step,
        step_time_ci95=step_ci,
        parity=parity.verdict,
        parity_note=parity.note,
        quality=quality.verdict if quality is not None else NOT_MEASURED,
        quality_note=quality.note if quality is not None else "",
        step_ms=step_ms,
        peak_allocated_bytes=peaks,
        peak_verdict=peak.verdict,
        killed=result.killed.reason if result.killed is not None else None,
        killed_kind=result.killed.kind if result.killed is not None else None,
        wall_s=result.wall_s,
        warnings=tuple(result.warnings),
        tokens_differ=None not in per_step and per_step[0] != per_step[1],
        phase_s=dict(getattr(result, "phase_s", {}) or {}),
        num_steps=result.config.num_steps,
        timed_steps=timed_pairs(getattr(result, "samples", None)) or None,
        timed_eager_random=bool(getattr(result, "timed_eager_random", False))
        and not compiles_without_inductor(stack),
        step_ms_each=_each_step_ms(getattr(result, "samples", None)),
        ab=result,
    )


def _each_step_ms(samples: Any) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    """Each side's timed step times (ms, to the microsecond), baseline first; None where the
    A/B timed no steps."""
    if not samples or not all(name in samples for name in ("baseline", "candidate")):
        return None
    return tuple(  # type: ignore[return-value]
        tuple(round(ms, 3) for ms in samples[name].dur_ms) for name in ("baseline", "candidate")
    )


def compiles_without_inductor(stack: Stack) -> bool:
    """Whether the stack compiles and none of its compile levers uses inductor
    (``compile-model:backend=cudagraphs`` replays eager's kernels): its programs draw random
    numbers with eager's ops whatever inductor's ``fallback_random`` said while they compiled,
    so timing its parity steps' programs times what the user runs (ab counts every program
    compiled meanwhile, whatever its backend)."""
    backends = [parse_lever_spec(spec)[1].get("backend", "inductor")
                for spec in stack if lever_id_of(spec) in COMPILE_LEVERS]
    return bool(backends) and "inductor" not in backends
