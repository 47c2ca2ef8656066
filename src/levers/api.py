"""The front object over the analyses: one :class:`Step` of one workload, captured once and
handed to every analysis (as Holistic Trace Analysis holds one parsed trace for its analyzers).

    import levers

    step = levers.Step("demo", params={"size": "tiny"})
    capture = step.capture(warmup=1, timed=3)       # once; every analysis below reuses it
    audited = step.audit(target="h100")             # findings ranked, with the memory model's numbers
    plan = step.memory(gpu="h200")                  # a MemoryPlan (predicted without a GPU)
    result = step.ab("rms-norm-fused,fused-optimizer")   # an AbResult (levers, or a candidate spec)
    tuned = step.tune(budget="10m")                 # a TuneResult: the fastest proven stack

Every verb calls this object (``levers audit``, ``memory``, ``ab``, ``tune``); the in-loop
capture (:func:`levers.capture_step`), the script runner and the Trainer and Lightning callbacks
hand their captures to it (:meth:`Step.from_capture`). ``import levers`` loads this module on the
first read of ``levers.Step``, and ``levers --help`` never does: both stay light.
"""

from __future__ import annotations

import difflib
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import levers.capture
import levers.memory
from levers.ab import design as design_mod
from levers.ab import runner as ab_runner
from levers.audit.config import capture_on_gpu
from levers.audit.options import AuditOptions
from levers.audit.run import audit_step
from levers.distributed.ab import run_ab_distributed
from levers.distributed.world import world_from_env
from levers.hardware import DEFAULT_GPU, GpuSpec
from levers.levers import load_all
from levers.levers.applicability import with_applicability
from levers.levers.handle import apply_to_workload, find_specs
from levers.levers.lever import LeverNotFound, lever_id_of
from levers.loader import call_factory, load_workload, looks_like_spec, resolve_factory
from levers.memory.fit import fit_param
from levers.memory.measure import measure_peaks
from levers.memory.options import MemoryOptions
from levers.memory.prediction import source_of
from levers.memory.steps import DEFAULT_NUM_STEPS
from levers.options import options_or_keywords
from levers.tune import measure as tune_measure
from levers.tune import run as tune_run
from levers.tune.claims import measured_audit
from levers.tune.measure import TrialDesign, remembered
from levers.tune.options import TuneOptions
from levers.workload import Workload

if TYPE_CHECKING:
    from levers.ab.runner import AbResult
    from levers.audit.run import AuditedStep
    from levers.capture.records import Capture
    from levers.memory.plan import FitPoint, FitResult, Measured, MemoryPlan
    from levers.tune.result import TuneResult

DEFAULT_WARMUP = 1
DEFAULT_TIMED = 3


def _validated(workload_or_spec: Any) -> Any:
    """The spec, factory or Workload, refused early with what to pass instead."""
    if isinstance(workload_or_spec, str):
        resolve_factory(workload_or_spec)  # an unknown spec raises WorkloadNotFound here
        return workload_or_spec.strip()
    if isinstance(workload_or_spec, Workload) or callable(workload_or_spec):
        return workload_or_spec
    raise TypeError(
        "levers.Step takes a workload spec ('demo', 'path/file.py:factory', 'pkg.mod:factory'), "
        f"a factory function returning a levers.Workload, or a Workload; got "
        f"{type(workload_or_spec).__name__}"
    )


class Step:
    """One training step of a workload: a spec, a factory (with ``params``) or a built
    :class:`levers.Workload`.

    The workload is built once and captured once (:meth:`capture`); :meth:`audit` reads that
    capture, and the memory plans it predicts are the ones :meth:`memory` returns. The memory
    model and :meth:`ab` build the workload themselves, so they need a spec or a factory, not a
    built Workload.

    Raises:
        WorkloadNotFound: a spec that names no built-in, file or module.
        TypeError: anything else than a spec, a factory or a Workload.
    """

    def __init__(self, workload_or_spec: Any, params: dict[str, Any] | None = None) -> None:
        self.source = _validated(workload_or_spec)
        if isinstance(self.source, Workload) and params:
            raise TypeError("params are a factory's: a built Workload takes none")
        self.params = dict(params or {})
        self._workload: Workload | None = (
            self.source if isinstance(self.source, Workload) else None
        )
        self._captures: dict[tuple[int, int], Any] = {}
        self._plans: dict[tuple, Any] = {}
        # A/Bs already run on this step, per trial design: the audit's measured claims are the
        # first increments tune would try, so tune reads them rather than running them again
        self._trials: dict[Any, dict] = {}

    @classmethod
    def from_capture(cls, capture: Capture, workload: Workload | None = None) -> Step:
        """A Step of a capture made elsewhere: in the user's own loop, by a Trainer or Lightning
        callback, or from a script. :meth:`audit` reads it; :meth:`memory`, :meth:`ab` and
        :meth:`tune` build the workload again from a spec, which such a Step does not have."""
        step = cls.__new__(cls)
        step.source = workload
        step.params = {}
        step._workload = workload
        step._captures = {(-1, -1): capture}
        step._plans = {}
        return step

    def __repr__(self) -> str:
        if self.source is None:
            return "Step.from_capture(...)"
        label = self.source if isinstance(self.source, str) else getattr(
            self.source, "name", getattr(self.source, "__name__", "workload")
        )
        return f"Step({label!r}, params={self.params!r})"

    @property
    def spec(self) -> str | None:
        return self.source if isinstance(self.source, str) else None

    def workload(self) -> Workload:
        """The built workload (built on first use, then kept).

        Raises:
            TypeError: a Step of a capture made elsewhere, without its workload.
        """
        if self._workload is None and self.source is None:
            raise TypeError("this Step holds a capture made elsewhere, without its workload")
        if self._workload is None:
            if isinstance(self.source, str):
                self._workload = load_workload(self.source, self.params)
            else:
                self._workload = call_factory(self.source, self.params)
        return self._workload

    def release(self) -> None:
        """Drop the workload built from the spec or factory (its model, gradients and optimizer
        state: GPU memory), so that the next use builds it again. A Step given a built workload
        keeps it. ``tune`` calls it before its A/Bs, which build their own sides."""
        if isinstance(self.source, Workload) or self.source is None:
            return
        self._workload = None

    def capture(
        self,
        *,
        warmup: int = DEFAULT_WARMUP,
        timed: int = DEFAULT_TIMED,
        progress: Callable[[int, str], None] | None = None,
    ) -> Capture:
        """The step's :class:`levers.capture.records.Capture`: ``warmup`` plain steps,
        ``timed`` timed ones, then the captured step. Captured once per (warmup, timed); the
        first capture is the one :meth:`audit` reads."""
        key = (warmup, timed)
        if key not in self._captures:
            workload = self.workload()
            # read from the package at call time, so a test's stand-in is the one called
            captured = levers.capture.capture_step(
                workload, warmup=warmup, timed=timed, progress=progress
            )
            # which levers can act on this model: the recommended stack holds only those
            self._captures[key] = with_applicability(captured, workload)
        return self._captures[key]

    def _current_capture(self) -> Capture:
        if self._captures:
            return next(iter(self._captures.values()))
        return self.capture()

    def _memory_source(self) -> Any:
        if self.source is None or isinstance(self.source, Workload):
            return None
        return self.source

    def _memory_source_or_refuse(self, method: str) -> Any:
        source = self._memory_source()
        if source is None:
            raise TypeError(
                f"Step.{method} needs to build the workload itself, under fake tensors: make the "
                "Step from its spec or factory (levers.Step('llama', params=...)), not a Workload"
            )
        return source

    def _memory_params(self) -> dict[str, Any]:
        # the prediction is of the GPU run: a device parameter (the device a capture ran on
        # here) is not passed to the factory
        return {k: v for k, v in self.params.items() if k != "device"}

    def memory(
        self,
        *,
        gpu: str | GpuSpec = DEFAULT_GPU,
        margin: float | None = None,
        num_steps: int | None = None,
        whatifs: bool = False,
        world_size: int | None = None,
        strategy: str | None = None,
        lever_ids: Sequence[str] = (),
        options: MemoryOptions | None = None,
    ) -> MemoryPlan:
        """levers memory's :class:`levers.memory.MemoryPlan` of the step on ``gpu`` (any name
        of :mod:`levers.hardware`, or a budget such as ``"40GiB"``), kept per arguments.

        The prediction is of the GPU run: a ``device`` parameter (the device a capture ran on
        here) is not passed to the factory. ``world_size``: also predict each of that many
        data-parallel ranks sharing the model by ``strategy`` (``ddp``, the default, ``zero1``
        or ``fsdp2``), in the plan's ``extra["per_rank"]``. ``lever_ids``: levers applied to
        every predicted build (``compile-blocks`` is predicted compiled, as inductor partitions
        it; a lever that does not apply is skipped). The keywords but ``lever_ids`` are
        :class:`levers.memory.options.MemoryOptions`'; ``options`` passes the record whole
        instead (``levers memory`` does), and then no other of them may be given.

        Raises:
            TypeError: the Step holds a built Workload (the model builds it again under fake
                tensors: give the Step its spec or factory); ``options`` with another option.
            ValueError: an unknown GPU, a margin outside [0, 1), fewer than one step or rank,
                an unknown strategy or one without ``world_size``, ``lever_ids`` with
                ``world_size``, an unknown lever.
        """
        options = options_or_keywords(
            "Step.memory", options, MemoryOptions.checked,
            dict(gpu=gpu, margin=margin, num_steps=num_steps, whatifs=whatifs,
                 world_size=world_size, strategy=strategy),
        )
        source = self._memory_source_or_refuse("memory")
        if lever_ids and options.world_size is not None:
            raise ValueError("lever_ids predicts one rank's step; leave out world_size")
        key = (options, tuple(lever_ids))
        if key not in self._plans:
            transform = _lever_transform(lever_ids) if lever_ids else None
            # read from the package at call time, so a test's stand-in is the one called
            plan = levers.memory.predict_memory(
                source, params=self._memory_params(), transform=transform, options=options
            )
            self._plans[key] = _with_skipped(plan, transform)
        return self._plans[key]

    def fit(
        self,
        param: str = "batch_size",
        *,
        gpu: str | GpuSpec = DEFAULT_GPU,
        margin: float | None = None,
        num_steps: int | None = None,
        start: int | None = None,
        progress: Callable[[FitPoint], None] | None = None,
        lever_ids: Sequence[str] = (),
        options: MemoryOptions | None = None,
    ) -> FitResult:
        """The largest integer ``param`` (a factory parameter) whose predicted peak fits
        ``gpu`` less the margin, searched from ``start`` (default: the Step's value of it).
        ``options`` passes ``gpu``, ``margin`` and ``num_steps`` as one
        :class:`levers.memory.options.MemoryOptions`, as for :meth:`memory`.

        Raises:
            TypeError: the Step holds a built Workload; ``options`` with another option.
            ValueError: an unknown GPU, a margin outside [0, 1), fewer than one step;
                ``options`` with a world size (the fit is of one rank's step).
        """
        options = options_or_keywords(
            "Step.fit", options, MemoryOptions.checked,
            dict(gpu=gpu, margin=margin, num_steps=num_steps),
        )
        if options.world_size is not None:
            raise ValueError("Step.fit fits one rank's step; leave out the world size")
        built = source_of(
            self._memory_source_or_refuse("fit"),
            self._memory_params(),
            _lever_transform(lever_ids) if lever_ids else None,
        )
        return fit_param(
            built,
            options,
            param,
            start=start if start is not None else built.params.get(param, 1),
            progress=progress,
        )

    def measure_memory(
        self, *, num_steps: int | None = None, lever_ids: Sequence[str] = ()
    ) -> Measured:
        """The step's peaks measured on this machine's GPU (to set beside :meth:`memory`), with
        the levers ``lever_ids`` applied as :meth:`memory` predicts them.

        Raises:
            LeversError: no GPU here.
        """
        built = source_of(
            self._memory_source_or_refuse("measure_memory"),
            self._memory_params(),
            _lever_transform(lever_ids) if lever_ids else None,
        )
        return measure_peaks(built, num_steps=DEFAULT_NUM_STEPS if num_steps is None else num_steps)

    def audit(
        self,
        *,
        target: str | None = None,
        torch_version: str | None = None,
        assume_dtype: str | None = None,
        select: Sequence[str] = (),
        ignore: Sequence[str] = (),
        benchmark: bool = True,
        memory_model: bool = True,
        set_items: Sequence[str] = (),
        progress: Any = None,
        measure: bool | Callable[..., Any] | None = None,
        options: AuditOptions | None = None,
    ) -> AuditedStep:
        """The audit of the captured step (captured now with the defaults if :meth:`capture`
        was not called): an :class:`levers.audit.run.AuditedStep` with the priced findings,
        the ranked report and the memory model's prediction (None with
        ``memory_model=False`` or for a Step of a built Workload).

        The keywords are :class:`levers.audit.options.AuditOptions`' (``target`` is its
        ``gpu``); ``options`` passes the record whole instead (``levers audit`` does), and then
        no other option may be given.

        ``measure``: A/B each lever of the recommended stack on this step, then the stack, and
        put the measured savings in place of the estimates (:mod:`levers.tune.claims`; the
        result's ``claims`` holds them). None (the default) measures when the capture ran on a
        GPU, no GPU is named and the Step is of a spec; a callable is the A/B to use
        (:data:`levers.tune.trial.Measure`, a test's fake).

        Raises:
            ValueError: a selector that matches no rule, an unknown target or torch version.
            TypeError: ``measure=True`` on a Step of a built Workload; ``options`` with another
                option.
        """
        options = options_or_keywords(
            "Step.audit", options, AuditOptions.checked,
            dict(gpu=target, torch_version=torch_version, assume_dtype=assume_dtype,
                 select=select, ignore=ignore, benchmark=benchmark, memory_model=memory_model,
                 set_items=set_items),
        ).with_workload(self.spec)
        capture = self._current_capture()
        source = self._memory_source() if options.memory_model else None
        audited = audit_step(
            capture,
            options,
            workload=self._workload if self.source is None else self.workload(),
            source=source,
            params=self.params,
            predict=self._predict_for_audit,
            progress=progress,
        )
        measure_ab = self._claims_measure(measure, capture, options.gpu)
        if measure_ab is None:
            return audited

        say = progress.say if progress is not None else (lambda _message: None)
        return measured_audit(
            audited,
            measure_ab,
            workload_spec=self.spec,
            set_items=list(options.set_items) or [f"{k}={v}" for k, v in self.params.items()],
            say=say,
        )

    def _claims_measure(self, measure: Any, capture: Any, gpu: Any) -> Any:
        """The A/B that measures the audit's claims, or None to keep the estimates."""
        if callable(measure):
            return measure
        if measure is None:
            measure = capture_on_gpu(capture) and gpu is None and self.spec is not None
        if not measure:
            return None
        if self.spec is None:
            raise TypeError(
                "Step.audit(measure=True) A/Bs the levers by building the workload again: make "
                "the Step from a spec such as 'demo' or 'path/file.py:factory'"
            )
        return self._ab_measure()

    def _ab_measure(self, design: Any = None, sides: str = "together") -> Any:
        """ab's A/B on this step's spec, remembering each trial for this Step."""
        design = design or TrialDesign()
        memory = self._trials.setdefault((design, sides), {})
        # read from the module at call time, so a test's stand-in is the one called
        return remembered(
            tune_measure.ab_measure(self.spec, self.params, design, sides), memory
        )

    def _predict_for_audit(self, gpu: GpuSpec, whatifs: bool) -> MemoryPlan:
        return self.memory(gpu=gpu, whatifs=whatifs)

    def ab(
        self,
        candidate_or_levers: str | Sequence[str] | None = None,
        *,
        params_b: dict[str, Any] | None = None,
        exactness: str | None = None,
        steps: int | None = None,
        warmup: int | None = None,
        parity_steps: int | None = None,
        resamples: int | None = None,
        seed: int | None = None,
        mem_gate_gib: float | None = None,
        time_budget_s: float | None = None,
        candidate: str | None = None,
        levers: Sequence[str] = (),
        dist_timeout_s: float = 300.0,
        sides: str = "together",
    ) -> AbResult | None:
        """A parity-gated A/B of this step (the baseline) against a candidate: lever ids
        (``"rms-norm-fused,fused-optimizer"`` or a list, applied to this workload), another
        workload spec, or None with ``params_b`` (the same workload, other parameters);
        ``candidate`` and ``levers`` name both at once (a candidate spec with levers on it).
        Returns the
        :class:`levers.ab.runner.AbResult`; nothing is recorded or printed (the ``levers ab``
        command does that).

        Under torchrun, both sides run on every rank and rank 0 merges the step times (ranks
        wait ``dist_timeout_s`` for each other); the other ranks return None.
        ``sides="one-at-a-time"`` runs each side alone, for steps two of which do not fit the
        device (``levers ab --sides``).

        Raises:
            TypeError: the Step is not of a spec (each side is built again from it).
            LeversError: an unknown lever, or a design that cannot run.
        """
        if self.spec is None:
            raise TypeError(
                "Step.ab builds each side from the workload spec: make the Step from a spec "
                "such as 'demo' or 'path/file.py:factory'"
            )
        named, lever_specs = _candidate_and_levers(candidate_or_levers)
        if named is not None and candidate is not None:
            raise TypeError("Step.ab: name the candidate spec once (candidate_or_levers or candidate)")
        candidate = candidate if candidate is not None else named
        lever_specs = [*lever_specs, *levers]
        given = {
            "baseline": self.spec,
            "candidate": candidate,
            "params": self.params,
            "params_b": params_b,
            "levers": lever_specs or None,
            "exactness": exactness,
            "steps": steps,
            "warmup": warmup,
            "parity_steps": parity_steps,
            "resamples": resamples,
            "seed": seed,
        }
        kill = {"mem_gate_gib": mem_gate_gib, "time_budget_s": time_budget_s}
        design, kill = design_mod.resolve(
            {k: v for k, v in given.items() if v is not None},
            {k: v for k, v in kill.items() if v is not None},
            None,
        )
        baseline, candidate_side, chosen = design_mod.sides(design)
        config = design_mod.config(design, kill, chosen, sides)

        world = world_from_env()
        if world.is_distributed:
            return run_ab_distributed(baseline, candidate_side, config, world, dist_timeout_s)
        # read from the module at call time, so a test's stand-in is the one called
        return ab_runner.run_ab(baseline, candidate_side, config)


    def tune(
        self,
        *,
        budget: str | float | None = None,
        levers: str | Sequence[str] | None = None,
        exclude: str | Sequence[str] = (),
        steps: int | None = None,
        warmup: int | None = None,
        parity_steps: int | None = None,
        resamples: int | None = None,
        seed: int = 0,
        audit: bool = True,
        record: Any = None,
        measure: Callable[..., Any] | None = None,
        progress: Callable[[str], None] | None = None,
        clock: Callable[[], float] | None = None,
        set_items: Sequence[str] = (),
        options: TuneOptions | None = None,
    ) -> TuneResult:
        """``levers tune``: the fastest stack of levers that keeps parity on this step, found by
        paired A/Bs (greedy, best expected saving first) within ``budget`` ("10m", "90s" or
        seconds; None: the default, 10m). Returns a :class:`levers.tune.result.TuneResult`; its
        ``stack`` is empty when
        nothing pays. ``levers`` restricts the search to these ids, ``exclude`` leaves ids out;
        ``steps`` .. ``seed`` are each A/B's design; ``audit=False`` takes the candidates from
        the catalogue alone; ``record`` is a JSON-lines file each A/B and the result are
        appended to. ``measure`` replaces the A/B (a test's fake, see
        :class:`levers.tune.trial.Measure`: a confirmation asks it for its timed steps with
        ``steps=``), ``clock`` the budget's clock; ``set_items`` are the ``--set`` items as
        typed, for the printed ``levers ab`` command. The options are
        :class:`levers.tune.options.TuneOptions`'; ``options`` passes the record whole instead
        (``levers tune`` does), and then no other option may be given. Each lever kept was
        selected by one A/B and confirmed by a fresh one; ``interrupted`` marks a search that
        Ctrl-C ended.

        Raises:
            TypeError: the Step is not of a spec (each side is built again from it).
            ValueError: an unreadable budget, an unknown lever id, a design that cannot run.
            TypeError: ``options`` with another option.
        """
        options = options_or_keywords(
            "Step.tune", options, TuneOptions.checked,
            dict(budget=budget, levers=levers, exclude=exclude, steps=steps, warmup=warmup,
                 parity_steps=parity_steps, resamples=resamples, seed=seed, audit=audit,
                 record=record, set_items=set_items),
        )
        # read from the module at call time, so a test's stand-in is the one called
        return tune_run.tune_step(
            self,
            options,
            measure=measure,
            say=progress or (lambda _message: None),
            clock=clock or time.monotonic,
            measure_for=None if self.spec is None
            else lambda sides: self._ab_measure(options.design, sides),
        )



def _lever_transform(ids: Sequence[str]) -> Callable[[Workload], None]:
    """Apply the levers ``ids`` to a workload built for a memory prediction (those that do not
    apply are skipped, as raise-batch's prediction skips them)."""
    find_specs(list(ids))  # an unknown id or option is refused now, not in the prediction

    skipped: dict[str, str] = {}

    def transform(workload: Workload) -> None:
        handle = apply_to_workload(workload, list(ids), quiet=True)
        skipped.update(handle.skipped)

    transform.skipped = skipped  # type: ignore[attr-defined]
    return transform


def _with_skipped(plan: MemoryPlan, transform: Any) -> MemoryPlan:
    """``plan`` with the levers its prediction could not apply, and why, in
    ``extra["levers_skipped"]``: a prediction never passes for one with a lever it left out."""
    skipped = dict(getattr(transform, "skipped", None) or {})
    if not skipped:
        return plan

    return replace(plan, extra={**plan.extra, "levers_skipped": skipped})


def _candidate_and_levers(value: str | Sequence[str] | None) -> tuple[str | None, list[str]]:
    """(candidate spec, lever specs): a list is levers; a string is levers when a comma part
    starts with a lever id, else a workload spec when it has a spec's form.

    Raises:
        LeverNotFound: a string that is neither (``"no-such-lever"``).
    """
    if value is None:
        return None, []
    if not isinstance(value, str):
        return None, [str(v) for v in value]

    ids = load_all()
    parts = [p.strip() for p in value.split(",") if p.strip()]
    named = [p for p in parts if lever_id_of(p) in ids]
    # one lever id among them makes them lever specs: find_specs names the unknown ones
    if named:
        return None, parts
    if looks_like_spec(value):
        return value, []
    close = difflib.get_close_matches(lever_id_of(value), list(ids), n=1)
    hint = f" (did you mean the lever {close[0]}?)" if close else ""
    raise LeverNotFound(
        f"{value!r} names no lever{hint} and no workload; name the levers to A/B (\"a,b\" or a "
        "list; levers list shows them) or a candidate workload spec (a built-in name, "
        "path/to/file.py:factory or package.module:factory)"
    )
