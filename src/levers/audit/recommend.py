"""The recommended lever stack of an audit, and the one ``levers ab`` command that proves it.

The stack takes the ranked findings in order: each finding the audit recommends (its payoff is
positive and its rule did not mark it ``recommended: False``) adds the first of its levers
(``details["levers"]``, else ``lever``) that is implemented, does not clash with a lever already
in the stack, and is not already covered by one (a regional compile fuses the norm, RoPE and
SwiGLU chains that the fused-kernel levers target). A lever on the step's batches (packing)
is left out, with a note on how to apply it to a Trainer or DataLoader, when the capture shows
that the step exposes none (``settings["batches"]`` is null). On a CPU capture a lever that cannot run
without a CUDA device (its ``runs_on_cpu`` is False: ``raise-batch``) is left out, with a note
that says why, so that the command runs where the audit ran. A lever whose ``applies`` said no on
the captured model (the capture records every lever's answer: :mod:`levers.levers.applicability`)
is left out with its reason: the finding stays, its fix a change to the code at its line. The
command replays the workload as the user gave it, with ``--lever`` naming the stack:

    levers ab hf --set size=1b --lever compile-blocks,fused-linear-cross-entropy,raise-batch
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field

from levers.capture.records import Capture
from levers.audit.finding import Finding
from levers.audit.rank import payoff
from levers.audit.script_step import (
    apply_call,
    runs_hf_trainer,
    script_command,
    script_names,
    trainer_callback,
    tune_script_command,
)
from levers.levers import load_all
from levers.levers.applicability import recorded
from levers.script_defaults import TUNE_TAKES_SCRIPTS

# pairs that fail together, with why
CONFLICTS = {
    frozenset({"compile-blocks", "liger-kernels"}): (
        "torch.compile over a Liger-patched Hugging Face llama fails in dynamo on torch 2.11"
    ),
    frozenset({"compile-loss", "loss-valid-rows"}): (
        "both set a causal LM's loss_function: the one applied last replaces the other's"
    ),
}
# a lever that already does what another does
COVERS = {
    "compile-blocks": frozenset({"rms-norm-fused", "layer-norm-fused", "liger-kernels"}),
    # the whole model compiled fuses what the regional compile fuses, and the regional compile
    "compile-model": frozenset(
        {"rms-norm-fused", "layer-norm-fused", "liger-kernels", "compile-blocks", "compile-loss"}
    ),
    # the fused loss never calls the model's loss_function, whose compile would go unused
    "fused-linear-cross-entropy": frozenset({"compile-loss"}),
}


@dataclass(frozen=True)
class Recommendation:
    levers: tuple[str, ...]  # the stack, in the order of the findings that asked for it
    codes: tuple[str, ...]  # the finding codes each lever comes from, same order
    missing: tuple[str, ...]  # levers of the stack that are not implemented yet
    command: str | None  # the `levers ab` command; None when the stack is empty or no spec replays
    notes: tuple[str, ...]  # levers left out, and why
    # "proven" (the stack's own A/B on this step paid, levers.tune.claims) or "estimated"
    provenance: str = "estimated"
    proof: str = ""  # the stack's A/B in words, when it was measured
    tune_command: str | None = None  # the `levers tune` command that searches further
    # when no workload spec can replay the step (a script after --, an in-loop capture): what
    # works instead, one line each
    next_steps: tuple[str, ...] = ()
    # lever id -> why it does not apply to the captured model (the capture's answers)
    inapplicable: dict[str, str] = field(default_factory=dict)


def implemented_levers() -> frozenset[str]:
    """Ids of the levers in this levers' catalogue."""
    return frozenset(load_all())


def inapplicable_levers(capture: Capture, on_gpu: bool) -> dict[str, str]:
    """lever id -> why it does not apply to the captured model, from the answers the capture
    recorded (:mod:`levers.levers.applicability`; none recorded: empty). Left out of this: a
    lever on the factory's parameters (raise-batch: it never applies to a built model, and ab
    applies it before the build), and on a CPU capture a lever whose answer depends on the
    device (float8 needs a GPU of compute capability 8.9: the CPU's answer says nothing of the
    GPU run the audit estimates for)."""
    answers = recorded(capture)
    if not answers:
        return {}
    registry = load_all()
    out = {}
    for lever_id, reason in answers.items():
        lever = registry.get(lever_id)
        if reason is None or lever is None or lever.choose_params is not None:
            continue
        if lever.device_bound and not on_gpu:
            continue
        out[lever_id] = reason
    return out


def _inapplicable_note(lever: str, code: str, reason: str) -> str:
    return f"{code}: {lever} left out: it does not apply to this model ({reason})"


def cuda_only_levers() -> frozenset[str]:
    """Ids of the levers that refuse to run without a CUDA device, from their declarations."""
    return frozenset(lever.id for lever in load_all().values() if not lever.runs_on_cpu)


def batch_levers() -> frozenset[str]:
    """Ids of the levers that change the step's batches rather than the model (packing)."""
    return frozenset(lever.id for lever in load_all().values() if lever.acts_on_batches)


def _no_batches_note(lever: str, code: str) -> str:
    return (
        f"{code}: {lever} left out: it changes the step's batches and this step exposes none "
        "(step.batches, as the hf workload with lengths=longtail does); apply it to your "
        f'Trainer with levers.apply(trainer, "{lever}") before trainer.train(), or '
        f'LeversCallback(levers="{lever}"), or to a DataLoader with levers.apply(model, '
        f'"{lever}", data=loader)'
    )


def _cuda_only_note(lever: str, code: str, spec: str | None, gpu: str | None) -> str:
    if lever == "raise-batch" and spec:
        how = (
            "it fits the batch to the GPU it runs on; predict the fit here with "
            f"levers memory {shlex.quote(spec)} --gpu {gpu or 'h100'} --fit batch_size, and run "
            "it on the GPU"
        )
    elif lever == "raise-batch":
        how = "it fits the batch to the GPU it runs on: run the audit there"
    else:
        how = "run it on a GPU"
    return f"{code}: {lever} left out: it needs a CUDA GPU to run and this step ran on a CPU ({how})"


def lever_ids(finding: Finding) -> tuple[str, ...]:
    ids = finding.details.get("levers") or ([finding.lever] if finding.lever else [])
    return tuple(ids)


def is_recommended(finding: Finding, *, step_ms: float, peak_bytes: int, weight: float) -> bool:
    if finding.details.get("recommended") is False:
        return False
    return payoff(finding, step_ms=step_ms, peak_bytes=peak_bytes, weight=weight) > 0


def _clash(lever: str, stack: Sequence[str]) -> str | None:
    for other in stack:
        why = CONFLICTS.get(frozenset({lever, other}))
        if why is not None:
            return f"{lever} left out: it clashes with {other} ({why})"
    return None


def recommend(
    ranked: Sequence[Finding],
    capture: Capture,
    *,
    step_ms: float,
    weight: float,
    workload_spec: str | None = None,
    set_items: Sequence[str] = (),
    implemented: frozenset[str] | None = None,
    on_gpu: bool = True,
    gpu: str | None = None,
) -> Recommendation:
    """``on_gpu`` is False for a CPU capture: levers that need a CUDA device are left out, and
    the note names ``gpu`` (the target's memory-model name) for the prediction to run instead."""
    have = implemented_levers() if implemented is None else implemented
    cuda_only = frozenset() if on_gpu else cuda_only_levers()
    # a lever on the batches needs a step that exposes them (the capture says whether it does)
    no_batches = batch_levers() if capture.settings.get("batches") is None else frozenset()
    inapplicable = inapplicable_levers(capture, on_gpu)
    stack: list[str] = []
    codes: list[str] = []
    notes: list[str] = []
    peak = capture.memory.peak_bytes
    for finding in ranked:
        if not is_recommended(finding, step_ms=step_ms, peak_bytes=peak, weight=weight):
            continue
        ids = lever_ids(finding)
        covered = [
            i for i in ids if i in stack or any(i in COVERS.get(s, ()) for s in stack)
        ]
        if not ids or covered:
            continue
        choices = sorted(ids, key=lambda i: (i not in have, ids.index(i)))
        pick = None
        noted = False
        for lever in choices:
            if lever in cuda_only:
                notes.append(_cuda_only_note(lever, finding.code, workload_spec, gpu))
                continue
            if lever in no_batches:
                if not noted:  # one note per finding, naming its first lever on the batches
                    notes.append(_no_batches_note(lever, finding.code))
                    noted = True
                continue
            # a spec with options (ac-budget:budget=...) was not what the capture asked about
            if lever in inapplicable:
                notes.append(_inapplicable_note(lever, finding.code, inapplicable[lever]))
                continue
            clash = _clash(lever, stack)
            if clash is None:
                pick = lever
                break
            notes.append(f"{finding.code}: {clash}")
        if pick is not None:
            stack.append(pick)
            codes.append(finding.code)
    # a lever another one covers adds nothing (a fused norm under a regional compile)
    kept = [
        (lever, code) for lever, code in zip(stack, codes)
        if not any(lever in COVERS.get(other, ()) for other in stack if other != lever)
    ]
    levers = tuple(lever for lever, _ in kept)
    missing = tuple(lever for lever in levers if lever not in have)
    command = None
    next_steps: tuple[str, ...] = ()
    if levers and workload_spec:
        parts = ["levers", "ab", workload_spec]
        if set_items:
            parts += ["--set", *set_items]
        parts += ["--lever", ",".join(levers)]
        command = " ".join(shlex.quote(p) for p in parts)
    elif levers:
        next_steps = without_spec_steps(levers, capture)
    return Recommendation(
        # two findings of one rule (two attention classes, each written out) leave a lever out
        # for one reason: said once
        levers, tuple(code for _, code in kept), missing, command, tuple(dict.fromkeys(notes)),
        tune_command=tune_command(workload_spec, set_items), next_steps=next_steps,
        inapplicable=inapplicable,
    )


def tune_takes_scripts() -> bool:
    """Whether this installation's ``levers tune`` takes a script after ``--`` (a build whose
    tune asks for a factory instead gets no such command printed, since it would refuse)."""
    return TUNE_TAKES_SCRIPTS


def without_spec_steps(levers: Sequence[str], capture: Capture) -> tuple[str, ...]:
    """What proves or applies the stack when no workload spec replays the step: ``levers ab``
    builds each side from a factory, and a script (or the loop that captured in-line) has none.
    Naming the script to ``levers ab`` would import it, run its training, then refuse it. The
    apply line names the model and optimizer as the script does (or, where a Hugging Face
    Trainer runs the loop, adds the callback to it)."""
    stack = ",".join(levers)
    script = script_command(capture)
    names = script_names(capture)
    if runs_hf_trainer(names):
        code, what = trainer_callback(stack)
        apply = f"apply them to your Trainer: {code} ({what})"
    else:
        call, missing = apply_call(names, stack)
        where = "your script" if script else "your training code"
        apply = (
            f"apply them in {where}: with {call}: (the loop runs inside; undone on exit)"
            + (f"; {missing}" if missing else "")
        )
    steps = [
        apply,
        "prove them with levers ab: it builds each side from a factory, so write one that "
        "returns levers.Workload(model=..., step=...) (README.md, section Workloads), then "
        f"levers ab path/to/file.py:factory --lever {stack}",
    ]
    if script and tune_takes_scripts():
        tune, note = tune_script_command(script)
        said = f" ({note})" if note else ""
        steps.append(f"or search the stack that pays on it: {tune}{said}")
    return tuple(steps)


# --- measured or estimated (the figures come from levers.tune.claims) -----------------------

STACK_PROVEN = "proven"


def provenance_line(rec: Recommendation) -> str:
    """Whether the stack was measured on this step, and the search that goes further."""
    tune = f"; {rec.tune_command} searches for the fastest proven stack" if rec.tune_command else ""
    if rec.provenance == STACK_PROVEN:
        return f"proven on this step: {rec.proof}{tune}"
    return f"estimated, not measured on this step{tune}"


def tune_command(workload_spec: str | None, set_items: Sequence[str] = ()) -> str | None:
    """``levers tune SPEC --set ...``; None without a spec (a script or a built Workload)."""
    if not workload_spec:
        return None
    parts = ["levers", "tune", workload_spec]
    if set_items:
        parts += ["--set", *set_items]
    return " ".join(shlex.quote(p) for p in parts)
