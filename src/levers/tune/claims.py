"""Claims from measurement: on a GPU, the audit's savings replaced by A/Bs of its levers.

The audit's rules are pure functions of a capture and price each finding by a roofline or a
microbenchmark. Here, after the audit, each lever of its recommended stack is A/B'd on the
user's own step (the same :data:`levers.tune.trial.Measure` tune uses: ab's runner, its parity
gate and CI95), then the stack as a stack. Then:

- every finding that names a measured lever carries the measurement (``details["measured"]``);
  when the lever paid, the findings' costs become the measured saving (shared between the
  findings that asked for the lever in proportion to their estimates), provenance "measured";
  when it did not, the finding is not recommended and its message says what was measured;
- the findings are ranked again and the stack recommended again from them; its provenance is
  "proven" when the stack's own A/B against the baseline paid, and says what was measured.

On a CPU capture or with ``--gpu`` nothing is measured: the estimates stay, marked estimated.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from levers.audit.finding import Cost
from levers.audit.rank import memory_weight, rank
from levers.audit.recommend import STACK_PROVEN, lever_ids, recommend
from levers.audit.report import build_report
from levers.levers import load_all
from levers.tune.candidates import speed_alternatives
from levers.tune.trial import Measure, Stack, Trial, judge, speed_of
from levers.vocab import MEASURED

MEASURED_KEY = "measured"
# where the A/B timed a compiled model's programs with eager's random draws (levers.tune.measure)
EAGER_RANDOM_NOTE = (
    "timed with the compiled program's random numbers drawn as eager draws them, as its parity "
    "was judged (the program you run draws its own in its kernels)"
)


@dataclass(frozen=True)
class Claim:
    """One lever of the audit's stack, measured alone against the baseline, or on top of the
    levers it pays only with (``Lever.measured_on``: float8 on compile-blocks)."""

    lever: str
    codes: tuple[str, ...]  # the finding codes that asked for it
    claimed_ms: float  # the audit's estimate: the sum of those findings' savings
    measured_ms: float | None  # median step time saved in the A/B (negative: slower)
    pays: bool
    why: str  # judge's words: "pays: tokens/s 1.21x [1.18, 1.24]", "failed parity (...)"
    trial: Trial
    # the lever the findings asked for, when this one is another form of it measured beside it
    # (compile-model beside compile-blocks); None for a lever of the audit's own stack
    alternative_of: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "lever": self.lever, "codes": list(self.codes), "claimed_ms": self.claimed_ms,
            "measured_ms": self.measured_ms, "pays": self.pays, "why": self.why,
            "tokens_per_s_ratio": self.trial.tokens_per_s_ratio,
            "tokens_per_s_ci95": self.trial.tokens_per_s_ci95, "parity": self.trial.parity,
            "alternative_of": self.alternative_of,
            "timed_eager_random": self.trial.timed_eager_random,
        }


@dataclass(frozen=True)
class MeasuredClaims:
    claims: tuple[Claim, ...]
    stack: Stack  # the stack recommended after the measurements
    stack_trial: Trial | None  # its A/B against the baseline (the lever's own for one lever)
    proven: bool
    notes: tuple[str, ...] = ()


def _ignore(_: object) -> None:
    pass


def _claimed_ms(findings: Sequence[Any], lever: str) -> tuple[float, tuple[str, ...]]:
    asking = [f for f in findings if lever in lever_ids(f)]
    total = sum(f.cost.saved_ms for f in asking if f.cost is not None)
    return total, tuple(dict.fromkeys(f.code for f in asking))


def measure_levers(
    findings: Sequence[Any], stack: Stack, measure: Measure, say: Callable[[str], None] = _ignore
) -> list[Claim]:
    """Each lever of ``stack`` A/B'd alone against the baseline, then each other form of those
    levers that does the same job for speed (compile-model beside compile-blocks), so the
    finding recommends the form that paid most on this step rather than the one its rule
    names first."""
    claims = []
    for lever in stack:
        trial = _measure_on_its_base(lever, measure, say, "")
        pays, why = judge(trial)
        claimed, codes = _claimed_ms(findings, lever)
        claims.append(Claim(lever, codes, claimed, trial.saved_ms, pays, why, trial))
    measured = set(stack)
    for claim in list(claims):
        for other in speed_alternatives(claim.lever):
            if other in measured:
                continue
            measured.add(other)
            trial = _measure_on_its_base(
                other, measure, say, f", the other form of {claim.lever},"
            )
            pays, why = judge(trial)
            claims.append(Claim(other, claim.codes, claim.claimed_ms, trial.saved_ms, pays, why,
                                trial, alternative_of=claim.lever))
    return claims


def _measure_on_its_base(lever: str, measure: Measure, say: Callable[[str], None],
                         what: str) -> Trial:
    """``lever``'s A/B: on top of the levers it pays only with (``measured_on``), else, or
    where the A/B on them could not be built (compile-blocks finds no repeated blocks, say),
    against the baseline alone."""
    base = measured_on(lever)
    if base:
        say(f"measuring {lever}{what} on this step (A/B on top of {','.join(base)})")
        trial = measure(base, (*base, lever), None)
        if trial.error is None:
            return trial
        say(f"{','.join(base)} under {lever} could not be built ({trial.error}): {lever} alone")
    else:
        say(f"measuring {lever}{what} on this step (A/B against the baseline)")
    return measure((), (lever,), None)


def _measured_what(claim: Claim) -> str:
    base = tuple(lever for lever in claim.trial.base if lever != claim.lever)
    return f"{claim.lever} (on top of {','.join(base)})" if base else claim.lever


def measured_on(lever: str) -> Stack:
    """The levers ``lever`` is measured on top of (its ``measured_on``), in the catalogue's
    order; () for a lever that is measured alone or is not in the catalogue."""
    found = load_all().get(lever)
    return tuple(found.measured_on) if found is not None else ()


def chosen_forms(claims: Sequence[Claim]) -> dict[str, Claim]:
    """For each lever the findings asked for, the claim to act on: the form (itself or an
    alternative measured beside it) that paid with the largest speed-up (tune's
    :func:`~levers.tune.trial.speed_of`: tokens/s, else step time), else its own claim (which
    did not pay)."""
    out: dict[str, Claim] = {}
    for claim in claims:
        if claim.alternative_of is not None:
            continue
        forms = [claim, *(c for c in claims if c.alternative_of == claim.lever)]
        paying = [c for c in forms if c.pays and c.measured_ms is not None]
        out[claim.lever] = (
            max(paying, key=lambda c: speed_of(c.trial)) if paying else claim
        )
    return out


def _measured_cost(finding: Any, claim: Claim, share: float) -> Any:
    saved = (claim.measured_ms or 0.0) * share
    now = claim.trial.step_ms[0] if claim.trial.step_ms else None
    old = finding.cost
    estimate = f"{old.saved_ms:.3g} ms {old.provenance}" if old is not None else "unpriced"
    return Cost(
        provenance=MEASURED,
        now_ms=now,
        fixed_ms=None if now is None else now - saved,
        saved_bytes=old.saved_bytes if old is not None else 0,
        basis=(
            f"measured: {_measured_what(claim)} A/B'd on this step, {claim.why}; parity "
            f"{claim.trial.parity}; its {claim.measured_ms:.3g} ms saved per step is shared by "
            f"the finding(s) {', '.join(claim.codes)} (this one's estimate was {estimate})"
            + (f"; {EAGER_RANDOM_NOTE}" if claim.trial.timed_eager_random else "")
        ),
    )


def apply_claims(findings: Sequence[Any], claims: Sequence[Claim]) -> list[Any]:
    """The findings with the measurements attached (costs, recommendation, message)."""
    chosen = chosen_forms(claims)
    out = []
    for finding in findings:
        ids = lever_ids(finding)
        asked = next((i for i in ids if i in chosen), None)
        if asked is None:
            out.append(finding)
            continue
        claim = chosen[asked]
        details = {**finding.details, MEASURED_KEY: claim.to_dict()}
        message = finding.message
        if claim.lever != asked:
            own = next(c for c in claims if c.lever == asked)
            details["levers"] = [claim.lever, *(i for i in ids if i != claim.lever)]
            message = (
                f"{message} Measured on this step: {claim.lever}, the other form of {asked}, "
                f"{claim.why.removeprefix('pays: ')}; {asked} alone {own.why}."
            )
        if not claim.pays or claim.measured_ms is None:
            out.append(dataclasses.replace(
                finding,
                message=f"{message} Measured on this step: {_measured_what(claim)} {claim.why}; "
                "not recommended.",
                details={**details, "recommended": False},
            ))
            continue
        own_ms = finding.cost.saved_ms if finding.cost is not None else 0.0
        share = (own_ms / claim.claimed_ms if claim.claimed_ms > 0
                 else 1.0 / max(len(claim.codes), 1))
        out.append(dataclasses.replace(
            finding, message=message, cost=_measured_cost(finding, claim, share), details=details
        ))
    return out


def measured_audit(
    audited: Any,
    measure: Measure,
    *,
    workload_spec: str | None,
    set_items: Sequence[str] = (),
    say: Callable[[str], None] = _ignore,
) -> Any:
    """``audited`` (a :class:`levers.audit.run.AuditedStep`) with its claims measured: the
    findings priced by A/B, ranked again, and the stack recommended again and proven."""
    result = audited.result
    capture = audited.capture
    estimated = result.recommendation
    if estimated is None or not estimated.levers:
        return dataclasses.replace(audited, claims=MeasuredClaims((), (), None, False))
    claims = measure_levers(result.findings, tuple(estimated.levers), measure, say)
    weight = memory_weight(result.bottleneck.bound) if result.bottleneck else memory_weight("")
    findings = rank(
        apply_claims(result.findings, claims),
        step_ms=result.step_ms, peak_bytes=capture.memory.peak_bytes, weight=weight,
    )
    rec = recommend(
        findings, capture, step_ms=result.step_ms, weight=weight,
        workload_spec=workload_spec, set_items=set_items,
    )
    chosen = chosen_forms(claims)
    paid = {c.lever: c for c in chosen.values() if c.pays}
    notes = [f"{_measured_what(c)} measured on this step: {c.why}; not recommended"
             for c in claims if not c.pays and c.alternative_of is None]
    notes += [
        f"{c.lever} measured on this step: {c.why}, but {chosen[c.lever].lever}, another form "
        f"of it, paid more ({speed_of(chosen[c.lever].trial):.3f}x)"
        for c in claims
        if c.alternative_of is None and c.pays and chosen[c.lever].lever != c.lever
    ]
    stack = tuple(lever for lever in rec.levers if lever in paid)
    # levers the findings asked for afresh with no A/B of their own (those that did not pay are
    # noted above)
    measured = {c.lever for c in claims}
    unmeasured = [lever for lever in rec.levers if lever not in measured]
    if unmeasured:
        notes.append(f"not measured: {', '.join(unmeasured)} (left out of the proven stack)")
    # a lever measured on top of others (float8 on compile-blocks) paid with them: they join it,
    # under the code of the finding that asked for it
    codes = dict(zip(rec.levers, rec.codes))
    added = {
        base: codes.get(lever, "")
        for lever in stack for base in paid[lever].trial.base if base not in stack
    }
    stack = (*added, *stack)
    stack_trial: Trial | None = paid[stack[0]].trial if len(stack) == 1 else None
    if len(stack) > 1:
        say(f"measuring the stack {','.join(stack)} on this step")
        stack_trial = measure((), stack, None)
        pays, why = judge(stack_trial)
        if not pays:
            # a lever's own A/B proves it against the baseline only when it was measured alone
            alone = [paid[lever] for lever in stack if lever in paid and not paid[lever].trial.base]
            if alone:
                best = max(alone, key=lambda c: c.measured_ms or 0.0)
                notes.append(
                    f"the stack {','.join(stack)} measured as a stack: {why}; the proven stack "
                    f"is its best lever alone, {best.lever}"
                )
                stack, stack_trial = (best.lever,), best.trial
            else:
                notes.append(f"the stack {','.join(stack)} measured as a stack: {why}")
                stack, stack_trial = (), None
    proven = bool(stack)
    proof = ""
    if proven:
        _, proof = judge(stack_trial)
        proof = proof.removeprefix("pays: ") + f", parity {stack_trial.parity}"
    rec = _restacked(rec, stack, proof, proven, notes, STACK_PROVEN, added)
    result = dataclasses.replace(result, findings=tuple(findings), recommendation=rec)
    return dataclasses.replace(
        audited,
        result=result,
        report=build_report(capture, result),
        claims=MeasuredClaims(tuple(claims), stack, stack_trial, proven, tuple(notes)),
    )


def _restacked(rec: Any, stack: Stack, proof: str, proven: bool, notes: list[str],
               proven_word: str, added: dict[str, str] | None = None) -> Any:
    """The recommendation cut to the proven ``stack``, its command rewritten to name it;
    ``added``: levers of the stack the recommendation did not name (the levers a lever was
    measured on top of), each with the code it joins under, first."""
    added = {lever: code for lever, code in (added or {}).items() if lever in stack}
    kept = [(lever, code) for lever, code in zip(rec.levers, rec.codes) if lever in stack]
    pairs = [*added.items(), *kept]
    codes = tuple(code for _, code in pairs)
    command = rec.command
    if command is not None and rec.levers:
        old = ",".join(rec.levers)
        command = command.replace(f"--lever {old}", f"--lever {','.join(stack)}") if stack else None
    return dataclasses.replace(
        rec,
        levers=tuple(lever for lever, _ in pairs),
        codes=codes,
        command=command,
        notes=(*rec.notes, *notes),
        provenance=proven_word if proven else rec.provenance,
        proof=proof,
    )
