"""``levers tune`` composed: candidates from the audit and the catalogue, the search, the record.

:meth:`levers.Step.tune` calls :func:`tune_step`. The workload is built once (for the levers'
``applies`` and the audit's capture); every A/B builds its own sides again from the spec, as
``levers ab`` does. Nothing here times anything: the trials are ab's.
"""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from levers.ab.record import append_event
from levers.audit.config import low_precision_autocasts
from levers.capture.step import run_step_or_error
from levers.environment import environment
from levers.errors import StepError
from levers.levers import load_all
from levers.levers.catalogue import read_catalogue
from levers.levers.handle import apply
from levers.levers.lever import lever_id_of, target_of
from levers.tune.candidates import GPU_ONLY_PREFIX, LATE_FORMS, LATE_FORMS_BUDGET_S, candidates
from levers.tune.measure import ab_measure
from levers.tune.options import TuneOptions
from levers.tune.result import TuneResult, ab_prefix
from levers.tune.search import search
from levers.tune.trial import Measure, Trial

RECORD_EVENT_TRIAL = "tune-trial"
RECORD_EVENT_RESULT = "tune-result"


def _ignore(_: object) -> None:
    pass


@dataclass(frozen=True)
class AuditView:
    """What the search reads of the audit: the findings and step time (the candidates' order),
    its notes, whether two of the step do not fit on the GPU (the A/Bs then run their sides one
    at a time), the autocast states its capture saw (``"cuda:bfloat16"``) and what it found
    already right (levers with nothing to fix)."""

    findings: Sequence[Any] = ()
    step_ms: float = 0.0
    notes: tuple[str, ...] = ()
    crowded: bool = False
    autocast: tuple[str, ...] = ()
    already_right: tuple[Any, ...] = ()


def _findings(step: Any, say: Callable[[str], None]) -> AuditView:
    """The audit of ``step`` as the search reads it; an empty view (with a note) when the audit
    cannot run. A step that raises is raised (:class:`StepError`), before any A/B."""
    say("tune: auditing the step for candidate levers")
    try:
        # the estimates order the candidates; the search's own A/Bs are the measurements
        audited = step.audit(memory_model=False, measure=False)
    except StepError:
        raise  # the step itself fails: every A/B would fail alike, so nothing can be searched
    except Exception as exc:  # noqa: BLE001 - the catalogue still gives candidates
        first = (str(exc).strip().splitlines() or [""])[0]
        return AuditView(notes=(f"the audit could not run ({type(exc).__name__}: {first}); the "
                                "candidates are the catalogue's alone",))
    crowded = two_sides_note(audited.capture.memory, step.workload().device)
    if crowded:
        say(f"tune: {crowded}")
    return AuditView(
        findings=audited.findings, step_ms=audited.result.step_ms,
        notes=(crowded,) if crowded else (), crowded=crowded is not None,
        autocast=tuple(audited.capture.settings.get("autocast", ())),
        already_right=tuple(audited.report.already_right),
    )


AUTOCAST_LEVER = "autocast-bf16"
# levers whose gain exists only where a finding of the audit fires, with the code of the rule
# whose already-right check says the step has none of it, and what the lever does then
NOTHING_TO_FIX = {
    "loss-valid-rows": ("LOSS001", "with no padding it only adds a sync (a host read a step)"),
}


def step_autocasts(autocast_seen: Sequence[str], device: Any) -> str | None:
    """The low-precision autocast the audit's capture saw the step run under on its device
    (``"cuda:bfloat16"``), or None. A step that autocasts already gains nothing from
    ``autocast-bf16``: the step's own region, inside the lever's, sets the dtype its ops run
    in (the zoo's steps on a GPU, most training scripts)."""
    return next(iter(low_precision_autocasts(autocast_seen, torch.device(device).type)), None)


def applies_here(workload: Any, view: AuditView) -> Callable[[Any], str | None]:
    """Each lever's ``applies`` on the built workload, and what the audit saw of the step where
    that says more: ``autocast-bf16`` on a step that runs under autocast already (its
    ``applies`` sees the model and the step function, not the regions the step opens), a lever
    of :data:`NOTHING_TO_FIX` where the audit found its finding's pattern absent."""
    target = target_of(workload)
    running = step_autocasts(view.autocast, workload.device)
    right = {item.code: item for item in view.already_right}

    def applies_of(lever: Any) -> str | None:
        if lever.id == AUTOCAST_LEVER and running is not None:
            return (f"the step already runs under {running.split(':', 1)[1]} autocast (the "
                    "audit's capture saw it): the lever's region around it would change "
                    "nothing")
        code, then = NOTHING_TO_FIX.get(lever.id, (None, ""))
        if code in right:
            return (f"nothing for it to fix: the audit found {right[code].title} "
                    f"({right[code].detail}); {then}")
        return lever.applies(target)

    return applies_of


# the share of the device's memory two sides may take before an A/B is expected not to fit
TWO_SIDES_SHARE = 0.95


def two_sides_note(memory: Any, device: Any) -> str | None:
    """A warning when the captured step's peak, twice over, exceeds the GPU's memory: each A/B
    holds both its sides on the device at once."""
    device = torch.device(device)
    if device.type != "cuda" or getattr(memory, "source", None) != "cuda-allocator":
        return None
    total = torch.cuda.get_device_properties(device).total_memory
    peak = memory.peak_bytes
    if 2 * peak <= TWO_SIDES_SHARE * total:
        return None
    return (
        f"this step's peak is {peak / 2**30:.1f} GiB of the GPU's {total / 2**30:.0f} GiB: two "
        "such steps do not fit, so each A/B runs its sides one at a time (each built, checked "
        "and timed alone, then freed: a drift between the two blocks lands on the ratio, where "
        "sides run together alternate step by step); with few A/Bs in the budget, per-block "
        "compile goes first, a form that pays is kept and carries the later levers, and the "
        "other forms of its kind are tried in its place after float8; tuning at a smaller "
        "batch (--set batch_size=...) keeps the sides together"
    )


def catalogue_rows() -> list[Any]:
    try:
        return read_catalogue()
    except (OSError, ValueError, KeyError):
        return []  # no committed measurements: every lever is tried without an expectation


def gpu_only_note(skipped: Sequence[Any], device: str) -> str | None:
    """The note on the levers left out because their speed-up exists only on a GPU."""
    gpu_only = [s.lever for s in skipped if s.reason.startswith(GPU_ONLY_PREFIX)]
    if not gpu_only:
        return None
    return (
        f"{len(gpu_only)} lever(s) whose speed-up exists only on a GPU were left out on this "
        f"{device} run ({', '.join(gpu_only)}): run levers tune on a GPU for them"
    )


def lever_forms(model: Any, on_gpu: bool,
                budget_s: float | None = None) -> dict[str, tuple[str, ...]]:
    """Other forms of a lever to try beside it: whole-model compile in inductor's default mode
    where compile-model's own choice is CUDA graphs (a static step on a GPU); the peers time
    both, and which pays more depends on the step. There too, two fallbacks where no inductor
    form pays in the time (its compile too long): each repeated block's program under CUDA
    graphs (one block's compile per kind of block), then the step's CUDA graphs without
    inductor (:data:`~levers.tune.candidates.FALLBACK_FORMS`). Where
    compile-model's own choice is the default mode only because the model routes tokens to
    experts, reduce-overhead compile (its graphs skip what they cannot capture): the peers' form
    that ran 1.77x on the zoo's mixtral where the default mode ran 1.68x (H100, s51). Where
    ``budget_s`` is the default's or more, each compile lever's autotuned form last
    (:data:`LATE_FORMS`: the whole model's with CUDA graphs, on an MoE too, which skip what they
    cannot capture, as reduce-overhead's do; the blocks' without them)."""
    if not on_gpu:
        return {}
    # imported here: a lever module registers itself on import, and the catalogue's order is
    # the order its modules are first imported in (levers.levers.load_all)
    from levers.levers.compile_model import graph_blockers, static_step_reasons

    if graph_blockers(model):
        return {}
    out: dict[str, tuple[str, ...]]
    if static_step_reasons(model):
        out = {"compile-model": ("compile-model:mode=reduce-overhead",)}
    else:
        out = {"compile-model": ("compile-model:mode=default", "compile-model:backend=cudagraphs"),
               "compile-blocks": ("compile-blocks:mode=reduce-overhead",)}
    if budget_s is not None and budget_s >= LATE_FORMS_BUDGET_S:
        for form in LATE_FORMS:  # one autotuned form a lever, after its others
            out[lever_id_of(form)] = out.get(lever_id_of(form), ()) + (form,)
    return out


def _free_device(on_gpu: bool) -> None:
    gc.collect()
    if on_gpu:
        torch.cuda.empty_cache()


def _wraps_step(workload: Any, stack: Sequence[str]) -> bool:
    """Whether applying ``stack`` replaces the workload's step (so the script must call the
    handle's step); applied to the built workload and undone."""
    if not stack:
        return False

    before = workload.step
    try:
        handle = apply(workload, list(stack))
    except Exception:  # noqa: BLE001 - only a hint for the printed line
        return False
    try:
        return handle.step is not before
    finally:
        handle.undo()
        workload.step = before


def tune_step(
    step: Any,
    options: TuneOptions = TuneOptions(),
    *,
    measure: Measure | None = None,
    say: Callable[[str], None] = _ignore,
    clock: Callable[[], float] = time.monotonic,
    measure_for: Callable[[str], Measure] | None = None,
) -> TuneResult:
    """Search the fastest proven stack for ``step`` (a :class:`levers.Step` of a spec) with
    ``options`` (checked where they were given: :meth:`TuneOptions.checked`). The A/Bs are
    ``measure``'s, else ``measure_for(sides)``'s (ab's by default), whose sides run together
    unless two of the step do not fit the GPU (then ``"one-at-a-time"``)."""
    if step.spec is None:
        raise TypeError(
            "Step.tune builds each side of its A/Bs from the workload spec: make the Step from "
            "a spec such as 'demo' or 'path/file.py:factory'"
        )
    registry = load_all()
    design, record_path = options.design, options.record_path
    say(f"tune: building {step.spec}")
    workload = step.workload()
    on_gpu = torch.device(workload.device).type == "cuda"
    if options.use_audit:
        view = _findings(step, say)
    else:  # no capture, but a step that raises is refused before any A/B all the same
        run_step_or_error(workload)
        view = AuditView()
    notes = list(view.notes)
    # the --set items as the printed commands show them: as typed, else the Step's params
    shown_items = options.set_items or tuple(f"{k}={v}" for k, v in step.params.items())
    ordered, skipped = candidates(
        registry,
        applies_here(workload, view),
        slower_of=lambda lever: (
            lever.slower_here(target_of(workload)) if lever.slower_here is not None else None
        ),
        forms=lever_forms(workload.model, on_gpu, options.budget_s),
        # where the two sides of an A/B run one at a time, the cheaper compile first
        blocks_first=view.crowded,
        findings=view.findings,
        step_ms=view.step_ms,
        catalogue_rows=catalogue_rows(),
        on_gpu=on_gpu,
        only=options.only,
        exclude=options.exclude,
        ab_prefix=ab_prefix(step.spec, shown_items),
    )

    note = gpu_only_note(skipped, str(workload.device))
    if note:
        notes.append(note)
    # each A/B builds both its sides from the spec: the workload built for the candidates and
    # the audit (its weights, gradients and optimizer state) would be a third copy on the device
    # through the whole search
    device = str(workload.device)
    del workload
    step.release()
    _free_device(on_gpu)

    sides = "one-at-a-time" if view.crowded else "together"
    if measure is None:
        measure = (measure_for or (lambda how: ab_measure(step.spec, step.params, design, how)))(
            sides
        )
    found = search(
        ordered,
        measure,
        budget_s=options.budget_s,
        skipped=skipped,
        clock=clock,
        say=say,
        on_trial=record_trials(record_path, {"workload": step.spec, "params": step.params}),
        steps=design.steps,  # ab's A/B times as many steps as it is asked: a confirmation more
        # where the sides run one at a time, a group's first form that pays carries the later
        # groups, and its other forms are tried in its place once the peers' levers are
        defer_alternatives=view.crowded,
    )
    result = TuneResult(
        workload=step.spec,
        params=dict(step.params),
        set_items=shown_items,
        design=design,
        device=device,
        search=found,
        wraps_step=_wraps_step(step.workload(), found.stack) if found.stack else False,
        notes=tuple(notes),
    )
    if record_path is not None:
        record_result(record_path, result)
    return result


def record_trials(
    record_path: str | os.PathLike | None, head: dict[str, Any]
) -> Callable[[Trial], None]:
    """The search's ``on_trial``: each A/B appended to the record as it finishes, after
    ``head`` (what was tuned)."""

    def recorded(trial: Trial) -> None:
        if record_path is not None:
            append_event(record_path, {"event": RECORD_EVENT_TRIAL, **head, **trial.to_dict()})

    return recorded


def record_result(record_path: str | os.PathLike, result: TuneResult) -> None:
    """The answer appended to the record, with the environment it was found in."""
    append_event(
        Path(record_path),
        {"event": RECORD_EVENT_RESULT, **result.to_dict(),
         "environment": environment(result.device)},
    )

