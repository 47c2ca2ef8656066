"""One A/B comparison, start to finish: build, parity gate, warm-up, timed steps, reads.

The phases run in that order in one process on one device. Each phase that can be killed
returns what it measured together with the kill, so a killed run still produces a full
:class:`AbResult` (marked ``killed``) for the record.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any, Callable

import torch

from levers.ab.design_keys import DEFAULTS_BY_FIELD, DEFAULTS_BY_KEY, DESIGN_FIELDS, SIDES
from levers.ab.killlines import GIB, Kill, KillLines, time_left_s
from levers.ab.parity import (
    EXACT_REASON,
    EXACTNESS,
    ParityResult,
    is_low_precision,
    judge,
    reference_for,
    run_parity,
    run_parity_steps,
    tolerance_for,
)
from levers.ab.precision import LOW_PRECISION, autocast_probe
from levers.ab.repeat import check_repeatable
from levers.ab.rounding import check_rounding
from levers.ab.reference import Reference, unavailable
from levers.ab.quality import QualityRead, held_out_losses, quality_from, quality_read
from levers.ab.random_alike import Compiled, drawn_alike, recompile_for_timing
from levers.ab.reads import Read, compute_reads
from levers.ab.steps import unreadable_loss
from levers.ab.looks import decided, settled, stopped_note, looks as interim_looks
from levers.ab.timing import WINDOW_S, SideSamples, run_timed, warm_up, window_for
from levers.ab.stats import MIN_RESAMPLES
from levers.ab.verdict import decision, judged_reads
from levers.errors import LeversError
from levers.levers import load_all
from levers.levers.lever import lever_id_of
from levers.workload import Workload
from levers.vocab import CHANGES_NUMERICS, EXACT, fix_safety


DEFAULT_STEPS = DEFAULTS_BY_KEY["steps"]
# what an A/B whose sides ran one at a time says beside its reads
ONE_AT_A_TIME_NOTE = (
    "the sides ran one at a time (sides=one-at-a-time: the baseline built, checked, warmed up "
    "and timed, then freed, then the candidate): its time does not alternate with the "
    "baseline's, so a drift between the two blocks (clocks, temperature, other processes) lands "
    "on the ratio"
)
# below this many timed pairs a percentile-bootstrap CI95 rests on a handful of distinct means
MIN_STEPS_FOR_CI = 10


@dataclass(frozen=True)
class AbConfig:
    """The design of one comparison; recorded with every result."""

    # the design's numbers, named as the JSON record keeps them (levers.ab.design_keys)
    num_steps: int = DEFAULTS_BY_FIELD["num_steps"]
    num_warmup: int = DEFAULTS_BY_FIELD["num_warmup"]
    num_parity_steps: int = DEFAULTS_BY_FIELD["num_parity_steps"]
    num_resamples: int = DEFAULTS_BY_FIELD["num_resamples"]
    seed: int = DEFAULTS_BY_FIELD["seed"]  # the workloads', the parity reseed base, the bootstrap's
    exactness: str = CHANGES_NUMERICS
    # the least one-step parity tolerance the candidate's levers declare, and the lever
    # (levers.levers.lever.Lever.parity_floor); None: the table's alone
    parity_floor: float | None = None
    parity_floor_of: str = ""
    mem_gate_gib: float | None = None
    time_budget_s: float | None = None
    confidence: float = 0.95
    # "together": both sides live on the device and alternate step by step; "one-at-a-time":
    # each side is built, checked, warmed up and timed alone, then freed (ONE_AT_A_TIME_NOTE)
    sides: str = SIDES[0]
    # True: the timed steps run the programs the parity steps compiled, random numbers drawn as
    # eager draws them, rather than compiling them again as the user runs them (levers tune:
    # one compile of a compiled stack, not two, on a model that draws random numbers;
    # AbResult.timed_eager_random says where it happened)
    time_parity_programs: bool = False
    # True: the timed steps of sides that run together stop at an interim look where the
    # step-time ratio is decided (levers tune's A/Bs; levers.ab.looks). levers ab times every
    # step it is asked for
    stop_when_decided: bool = False
    # > 0: on CUDA, sides that run together alternate in windows of steps that last about this
    # many seconds rather than step by step (levers.ab.timing); 0: step by step. A result's
    # config holds the window its timed steps ran in (0 on a CPU, one at a time, several ranks)
    window_s: float = WINDOW_S

    @classmethod
    def from_design(cls, design: Mapping[str, Any], **fields: Any) -> AbConfig:
        """The config of ``design``, whose numbers are keyed as the user writes them
        (``steps``, ``warmup``, ``parity_steps``, ``resamples``, ``seed``; one it lacks takes its
        default; other keys are not read), with AbConfig's other ``fields``.

        Raises:
            ValueError: a design ab cannot run (as the constructor).
        """
        numbers = {field: design[key] for key, (field, _) in DESIGN_FIELDS.items() if key in design}
        return cls(**numbers, **fields)

    def __post_init__(self) -> None:
        for name in DEFAULTS_BY_FIELD:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
        if self.num_steps < 2:
            raise ValueError(f"num_steps must be at least 2 for a CI, got {self.num_steps}")
        if self.num_resamples < MIN_RESAMPLES:
            raise ValueError(
                f"num_resamples must be at least {MIN_RESAMPLES} for a CI, got "
                f"{self.num_resamples}"
            )
        # the older spelling "numerics-changing" still reads
        object.__setattr__(self, "exactness", fix_safety(self.exactness))
        if self.exactness not in EXACTNESS:
            raise ValueError(f"exactness must be one of {EXACTNESS}, got {self.exactness!r}")
        if self.parity_floor is not None and not 0.0 < self.parity_floor < 1.0:
            raise ValueError(f"parity_floor must be between 0 and 1, got {self.parity_floor!r}")
        if not (isinstance(self.window_s, (int, float)) and self.window_s >= 0):
            raise ValueError(f"window_s must be a non-negative number of seconds, got "
                             f"{self.window_s!r}")
        if self.sides not in SIDES:
            raise ValueError(f"sides must be one of {SIDES}, got {self.sides!r}")
        for name in ("mem_gate_gib", "time_budget_s"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be positive, got {value!r}")


@dataclass(frozen=True)
class Side:
    """How to build one side, and what to record about where it came from."""

    build: Callable[[], Workload]
    spec: str | None = None  # "demo", "path/to/file.py:factory", ...
    params: dict[str, Any] = field(default_factory=dict)  # as given on the command line
    levers: tuple[str, ...] = ()


@dataclass(frozen=True)
class SideInfo:
    name: str
    spec: str | None
    params: dict[str, Any]
    levers: tuple[str, ...]
    device: str
    tokens_per_step: int | None


@dataclass(frozen=True)
class AbResult:
    config: AbConfig
    baseline: SideInfo | None
    candidate: SideInfo | None
    parity: ParityResult | None
    samples: dict[str, SideSamples] | None
    reads: tuple[Read, ...]
    decision: str
    killed: Kill | None
    warnings: tuple[str, ...]
    started_at: str  # ISO 8601, UTC
    wall_s: float
    quality: QualityRead | None = None  # None: the run was killed before it
    # seconds each phase took: reference (the float64 run), build (both sides), parity, warmup,
    # timed, quality; a phase that did not run is absent
    phase_s: dict[str, float] = field(default_factory=dict)
    # the timed steps ran programs compiled with eager's random draws (time_parity_programs, on a
    # step that draws random numbers in a compiled model): not the program the user runs
    timed_eager_random: bool = False

    def read(self, name: str) -> Read:
        for read in self.reads:
            if read.name == name:
                return read
        raise KeyError(f"no read named {name!r}")


def _build(side: Side, seed: int) -> Workload:
    # factories that do not seed themselves still get the same weights on both sides
    torch.manual_seed(seed)
    workload = side.build()
    if not isinstance(workload, Workload):
        raise TypeError(
            f"a side's build() must return a levers.Workload, got {type(workload).__name__}"
        )
    return workload


def _info(side: Side, workload: Workload) -> SideInfo:
    params = dict(workload.params) or dict(side.params)
    return SideInfo(
        workload.name,
        side.spec,
        params,
        side.levers,
        str(workload.device),
        workload.tokens_per_step,
    )


def _check_one_device(a: Workload | _Facts, b: Workload | _Facts) -> None:
    if torch.device(a.device) != torch.device(b.device):
        raise LeversError(
            f"the baseline runs on {a.device} and the candidate on {b.device}; an A/B compares "
            "two sides on one device: set the same device for both (--set device=...)"
        )


@dataclass(frozen=True)
class _Facts:
    """What the record reads of a side once the side is freed (sides=one-at-a-time)."""

    device: str
    tokens_per_step: int | None
    unreadable: str | None  # why its loss could not be read (levers.ab.steps.unreadable_loss)


def _facts(workload: Workload) -> _Facts:
    return _Facts(str(workload.device), workload.tokens_per_step, unreadable_loss(workload))


def _warnings(
    config: AbConfig, a: _Facts, b: _Facts, samples: dict[str, SideSamples] | None
) -> list[str]:
    notes = [ONE_AT_A_TIME_NOTE] if config.sides == "one-at-a-time" else []
    if config.mem_gate_gib is not None and torch.device(a.device).type != "cuda":
        notes.append("the memory gate is not enforced on a CPU: memory is not measured there")
    if _tokens_differ(a, b):
        notes.append(
            f"tokens per step differ (baseline {a.tokens_per_step}, candidate "
            f"{b.tokens_per_step}): the decision reads tokens/s (and quality); step time, peak "
            "memory and one-step parity differ by design and are shown, not judged"
        )
    for side, s in (samples or {}).items():
        if s.resident_bytes_start != s.resident_bytes_end:
            notes.append(
                f"{side} resident bytes changed during the timed steps "
                f"({s.resident_bytes_start} -> {s.resident_bytes_end}); its peak uses the first"
            )
    if config.num_parity_steps == 0:
        notes.append("the parity gate was skipped (--parity-steps 0): numerics are unchecked")
    for side, facts in (("baseline", a), ("candidate", b)):
        why = facts.unreadable
        if why:
            notes.append(
                f"{side}: {why}; its loss was not compared and the NaN/inf kill line was off"
            )
    if config.num_steps < MIN_STEPS_FOR_CI:
        notes.append(
            f"only {config.num_steps} timed steps per side: a bootstrap CI95 from fewer than "
            f"{MIN_STEPS_FOR_CI} pairs is too wide to trust (and too narrow when it happens to "
            f"look tight); use --steps {DEFAULT_STEPS} or more"
        )
    return notes


def _tokens_differ(a: Any, b: Any) -> bool:
    return (
        a.tokens_per_step is not None
        and b.tokens_per_step is not None
        and a.tokens_per_step != b.tokens_per_step
    )


def run_ab(
    baseline: Side, candidate: Side, config: AbConfig, reference: Reference | None = None
) -> AbResult:
    """Compare two sides and return every measurement, the reads and their verdicts.

    ``reference`` is the float64 run of the parity steps when the caller has it already (one
    search's A/Bs share the workload's): it is then not run again.
    """
    started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    lines = KillLines(
        mem_gate_bytes=None if config.mem_gate_gib is None else int(config.mem_gate_gib * GIB),
        time_budget_s=config.time_budget_s,
        started_s=time.perf_counter(),
    )
    phase_s: dict[str, float] = {}
    clock = _PhaseClock(phase_s)
    kill = None
    if reference is None:
        # the float64 reference of the parity steps is built, run and freed before the sides
        # exist, so that its memory never adds to theirs
        with clock("reference"):
            reference, kill = reference_for(
                lambda: _build(baseline, config.seed),
                num_steps=config.num_parity_steps,
                exactness=config.exactness,
                seed=config.seed,
                lines=lines,
            )
    elif config.exactness == EXACT:
        reference = unavailable(EXACT_REASON)
    if config.sides == "one-at-a-time":  # no alternation: no window (the record says so)
        return _one_at_a_time(baseline, candidate, replace(config, window_s=0.0), reference,
                              kill, lines, clock, started_at)
    with clock("build"):
        a, b = _build(baseline, config.seed), _build(candidate, config.seed)
    _check_one_device(a, b)
    # the window the timed steps alternate in on this device, as the result records it
    config = replace(config, window_s=window_for(a.device, config.window_s))
    sides = (("baseline", a), ("candidate", b))
    parity: ParityResult | None = None
    eager_random = False
    if kill is None:
        # a compiled side draws its dropout masks as eager does while parity is judged; what was
        # compiled so is compiled again for the timed steps where the model draws random numbers
        parity_started = time.perf_counter()
        with clock("parity"), drawn_alike() as compiled:
            parity, kill = run_parity(
                a,
                b,
                num_steps=config.num_parity_steps,
                exactness=config.exactness,
                seed=config.seed,
                lines=lines,
                reference=reference,
                floor=config.parity_floor,
                floor_of=config.parity_floor_of,
            )
            if kill is None:
                parity, kill = _failed_gate(baseline, candidate, parity, config, lines)
        eager_random = _programs_for_timing(
            config, compiled, reference.draws_random,
            lambda: _replays_graphs(((baseline, a), (candidate, b))),
            time.perf_counter() - parity_started, lines,
        )
    samples = None
    if kill is None:
        with clock("warmup"):
            kill = warm_up(sides, config.num_warmup, lines)
    if kill is None:
        with clock("timed"):
            samples, kill = run_timed(sides, config.num_steps, lines, **_looks(config),
                                      window_s=config.window_s)
    quality = None
    if kill is None:
        with clock("quality"):
            quality = quality_read(
                a, b, config.exactness, num_resamples=config.num_resamples, seed=config.seed
            )
    return _result(config, (_info(baseline, a), _info(candidate, b)), (_facts(a), _facts(b)),
                   parity, samples, quality, kill, started_at, lines, phase_s, eager_random)


def _failed_gate(
    baseline: Side, candidate: Side, parity: ParityResult, config: AbConfig, lines: KillLines
) -> tuple[ParityResult, Kill | None]:
    """A gate that failed, asked twice more (any other is returned as it is): the baseline run
    again tells whose difference it is (:mod:`levers.ab.repeat`), then, where it is the
    candidate's, the candidate's own float64 run tells its math from its rounding
    (:mod:`levers.ab.rounding`, for levers whose change a float64 run keeps)."""
    parity, kill = check_repeatable(
        lambda: _build(baseline, config.seed), parity, seed=config.seed, lines=lines
    )
    if kill is not None:
        return parity, kill
    return check_rounding(
        lambda: _build(candidate, config.seed), parity,
        faithful=_float64_faithful(baseline, candidate), seed=config.seed, lines=lines,
    )


def _float64_faithful(baseline: Side, candidate: Side) -> bool:
    """Whether the sides differ only by levers and every lever of both keeps its change in a
    float64 run (``Lever.float64_faithful``)."""
    if not candidate.levers or (candidate.spec, candidate.params) != (baseline.spec,
                                                                     baseline.params):
        return False
    registry = load_all()
    return all(getattr(registry.get(lever_id_of(spec)), "float64_faithful", False)
               for spec in (*baseline.levers, *candidate.levers))


def _looks(config: AbConfig, against: SideSamples | None = None) -> dict[str, Any]:
    """run_timed's interim looks where the config asks to stop once decided, else none. With
    ``against`` (the baseline's steps, timed before: sides one at a time), the candidate's
    steps so far are looked at against as many of the baseline's, paired in step order as the
    reads pair them."""
    if not config.stop_when_decided:
        return {}
    if against is None:
        return {"looks": interim_looks(config.num_steps),
                "decided": lambda durations: decided(durations, seed=config.seed)}
    base = list(against.dur_ms)
    return {"looks": interim_looks(config.num_steps),
            "decided": lambda durations: decided(
                {"baseline": base, "candidate": durations["candidate"]}, seed=config.seed)}


def _settling(config: AbConfig, name: str) -> dict[str, Any]:
    """run_timed's interim looks at the first side of an A/B whose sides run one at a time,
    where the config asks to stop once decided: its steps stop where their median is settled
    (:func:`levers.ab.looks.settled`), else none."""
    if not config.stop_when_decided:
        return {}
    return {"looks": interim_looks(config.num_steps),
            "decided": lambda durations: settled(durations[name], seed=config.seed)}


def _result(
    config: AbConfig,
    infos: tuple[SideInfo | None, SideInfo | None],
    facts: tuple[_Facts, _Facts],
    parity: ParityResult | None,
    samples: dict[str, SideSamples] | None,
    quality: QualityRead | None,
    kill: Kill | None,
    started_at: str,
    lines: KillLines,
    phase_s: dict[str, float],
    timed_eager_random: bool = False,
) -> AbResult:
    """The reads, their verdicts and the decision of a run, whichever way its sides ran."""
    a, b = facts
    reads = compute_reads(
        samples,
        {"baseline": a.tokens_per_step, "candidate": b.tokens_per_step},
        parity,
        num_resamples=config.num_resamples,
        seed=config.seed,
        confidence=config.confidence,
    )
    verdicts = {r.name: r.verdict for r in reads}
    if quality is not None:
        verdicts["quality"] = quality.verdict
    return AbResult(
        config=config,
        baseline=infos[0],
        candidate=infos[1],
        parity=parity,
        samples=samples,
        reads=reads,
        decision=decision(judged_reads(verdicts, _tokens_differ(a, b)), killed=kill is not None),
        killed=kill,
        warnings=tuple(_warnings(config, a, b, samples)) + tuple(
            stopped_note(config.num_steps, samples, config.sides == "one-at-a-time")
            if kill is None and config.stop_when_decided else ()),
        started_at=started_at,
        wall_s=time.perf_counter() - lines.started_s,
        quality=quality,
        phase_s=phase_s,
        timed_eager_random=timed_eager_random and samples is not None,
    )


@dataclass
class _SideRun:
    """One side's run in an A/B whose sides run one at a time: what is kept once it is freed."""

    info: SideInfo
    low_precision: bool = False
    autocast: Any = None  # the autocast dtype its step ran under, if any
    samples: SideSamples | None = None
    held_out: torch.Tensor | str | None = None
    facts: _Facts | None = None  # read once the side's last step has run
    eager_random: bool = False  # its timed steps ran its parity steps' programs (random drawn alike)


def _run_side(
    name: str,
    side: Side,
    config: AbConfig,
    reference: Reference,
    lines: KillLines,
    clock: _PhaseClock,
    series: tuple[dict[str, list[float | None]], dict[str, list[float | None]]],
    against: SideSamples | None = None,
) -> tuple[_SideRun, Kill | None]:
    """Build one side, run its parity steps (into ``series``), warm-up, timed steps and
    held-out losses, then free it: the device holds one side at a time. ``against``: the
    baseline's timed steps, for the candidate's interim looks (``config.stop_when_decided``)."""
    with clock("build"):
        workload = _build(side, config.seed)
    run = _SideRun(_info(side, workload), is_low_precision(workload))
    device = torch.device(workload.device)
    losses, norms = series
    parity_started = time.perf_counter()
    with clock("parity"), drawn_alike() as compiled:
        with autocast_probe(workload.model, device.type) as autocast:
            kill = run_parity_steps([(name, workload)], config.num_parity_steps, config.seed,
                                    lines, losses, norms)
            run.autocast = autocast()
    run.eager_random = _programs_for_timing(
        config, compiled, reference.draws_random, lambda: _replays_graphs(((side, workload),)),
        time.perf_counter() - parity_started, lines,
    )
    if kill is None:
        with clock("warmup"):
            kill = warm_up([(name, workload)], config.num_warmup, lines)
    if kill is None:
        with clock("timed"):
            if against is None:  # the baseline, timed first: it stops where it is settled
                looks, num_steps = _settling(config, name), config.num_steps
            else:  # the candidate: paired with as many of the baseline's steps
                looks, num_steps = _looks(config, against), len(against.dur_ms)
            samples, kill = run_timed([(name, workload)], num_steps, lines, **looks)
        run.samples = samples[name]
    if kill is None and config.exactness != EXACT:
        with clock("quality"):
            run.held_out = held_out_losses(workload, config.seed)
    run.facts = _facts(workload)
    del workload
    _free(device)
    return run, kill


def _programs_for_timing(
    config: AbConfig,
    compiled: Compiled,
    draws_random: bool | None,
    replays_graphs: Callable[[], bool],
    parity_s: float,
    lines: KillLines,
) -> bool:
    """Drop what the parity steps compiled with eager's random draws, so that the timed steps
    compile the program the user runs (:func:`levers.ab.random_alike.recompile_for_timing`);
    or, with ``config.time_parity_programs``, keep it: returns whether the timed steps then run
    programs that draw random numbers as eager does (something was compiled, and the step draws
    random numbers or whether it does is not known).

    Kept, except where a side replays inductor's program as CUDA graphs (``replays_graphs()``)
    and the time left holds another compile (about the parity steps' ``parity_s`` again, and
    the timed steps after it): such a program compiled with eager's random draws does not time
    as the user's. On the arch workload's luke (H100, s54) reduce-overhead compile ran 60.2 ms a
    step so, where the same program as the user runs it ran 56.8 ms (5.7% faster than inductor's
    default mode, which ran 59.8 and 60.1 ms either way), and tune kept the default mode for it.
    """
    if config.time_parity_programs:
        eager_random = compiled.any and draws_random is not False
        if not eager_random or not replays_graphs():
            return eager_random
        left_s = time_left_s(lines)
        if left_s is not None and left_s < 2 * parity_s:
            return True
    recompile_for_timing(compiled, draws_random)
    return False


def _replays_graphs(sides: tuple[tuple[Side, Workload], ...]) -> bool:
    """Whether a side's levers compile its model with inductor and replay it as CUDA graphs."""
    load_all()  # the lever modules in the catalogue's order before one is imported by name
    from levers.levers.compile_model import replays_inductor_graphs

    return any(replays_inductor_graphs(side.levers, workload.model) for side, workload in sides)


def _free(device: torch.device) -> None:
    """The device's memory back from a freed side: its compiled programs and CUDA-graph pools
    dropped, garbage collected, the allocator's cache emptied."""
    torch._dynamo.reset()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def _one_at_a_time(
    baseline: Side,
    candidate: Side,
    config: AbConfig,
    reference: Reference,
    kill: Kill | None,
    lines: KillLines,
    clock: _PhaseClock,
    started_at: str,
) -> AbResult:
    """An A/B whose sides do not fit the device together: each side alone, the baseline first
    (:data:`ONE_AT_A_TIME_NOTE` says what that costs the comparison). With
    ``config.stop_when_decided`` the candidate's timed steps stop at an interim look that finds
    the ratio against the baseline's steps decided (the baseline's, timed first, cannot: there
    is nothing yet to compare them with); the reads then pair as many of the baseline's."""
    losses: dict[str, list[float | None]] = {"baseline": [], "candidate": []}
    norms: dict[str, list[float | None]] = {"baseline": [], "candidate": []}
    runs: dict[str, _SideRun] = {}
    for name, side in (("baseline", baseline), ("candidate", candidate)):
        if kill is not None:
            break
        base = runs["baseline"].samples if name == "candidate" else None
        run, kill = _run_side(name, side, config, reference, lines, clock, (losses, norms),
                              against=base)
        runs[name] = run
    if "candidate" in runs:
        _check_one_device(runs["baseline"].facts, runs["candidate"].facts)
    parity = None
    if len(runs) == 2 or (kill is not None and kill.phase == "parity"):
        seen = [str(r.autocast).removeprefix("torch.") for r in runs.values()
                if r.autocast is not None]
        tolerance = tolerance_for(
            config.exactness,
            any(r.low_precision or r.autocast in LOW_PRECISION for r in runs.values()),
            seen[0] if seen else None,
            config.parity_floor,
            config.parity_floor_of,
        )
        parity = judge(tolerance, losses, norms, config.num_parity_steps, kill, reference)
        if kill is None:
            with clock("parity"):
                parity, kill = _failed_gate(baseline, candidate, parity, config, lines)
            _free(torch.device(runs["baseline"].facts.device))
    samples = None
    if len(runs) == 2 and all(r.samples is not None for r in runs.values()):
        samples = {name: r.samples for name, r in runs.items()}
    quality = None
    if kill is None:
        quality = quality_from(
            runs["baseline"].held_out, runs["candidate"].held_out, config.exactness,
            num_resamples=config.num_resamples, seed=config.seed,
        )
    gone = _Facts("", None, None)
    infos = tuple(runs[n].info if n in runs else None for n in ("baseline", "candidate"))
    facts = tuple(runs[n].facts if n in runs else gone for n in ("baseline", "candidate"))
    return _result(config, infos, facts, parity, samples, quality, kill, started_at, lines,
                   clock.phase_s, any(r.eager_random for r in runs.values()))


class _PhaseClock:
    """``with clock("parity"):`` adds the seconds the block took to ``phase_s["parity"]``."""

    def __init__(self, phase_s: dict[str, float]) -> None:
        self.phase_s = phase_s

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.phase_s[phase] = round(
                self.phase_s.get(phase, 0.0) + time.perf_counter() - start, 3
            )
