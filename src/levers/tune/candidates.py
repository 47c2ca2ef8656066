"""The levers ``levers tune`` tries, in the order it tries them, and those it leaves out (why).

The order puts first what was measured, not what was estimated (a roofline estimate of 11.7 ms
saved by a fused loss ran 0.36x on an H200 at a 250k vocabulary and took half the budget, while
the lever worth 1.56x was never reached):

0. **What the compile forms would compile, on a GPU** (:data:`BEFORE_COMPILE`): the precision
   of the step's matmuls (bf16 autocast on a step that runs none; an MoE's expert GEMMs cast to
   autocast's dtype where they run in fp32) and an MoE's experts as grouped matmuls where they
   loop over the experts. What a performance engineer sets before compiling, because it changes
   what compile compiles: on a mixture of experts with fp32 expert weights, transformers sends
   the compiled step's expert matmuls to a per-expert fallback (glm_moe_dsa on an H100, s50:
   graph breaks where inductor failed on its ``.item()``). Measured eager on the zoo's mixtral
   (H200): the cast 2.22x tokens/s, the grouped matmuls 1.52x; ``model.compile()`` ran 1.08x on
   that model in another run, and tune's row, trying compile first, never reached the cast.
   Their A/Bs are eager, so cheap; each applies only where the step is not so already. The two
   casts (:data:`AUDIT_FIRST`) come first only where the audit of this step found the fp32
   matmuls they fix; elsewhere the evidence places them (on glm_moe_dsa, which the audit did
   not find in fp32, the experts' cast first measured 0.999x in two A/Bs of one-at-a-time sides
   that took 108 s of a 3-minute budget: H100, s51).
1. **The peers' own forms, on a GPU** (:data:`PEER_FORMS`): whole-model compile (CUDA graphs
   where the step is static), per-block compile, whole-model compile in inductor's default mode,
   then a convnet's convolutions in channels-last (timm's ``--channels-last``, tried on top of
   the compile form kept), then float8 on the compiled blocks: what a performance engineer and
   the peers (``model.compile()``, torchtitan's recipe, timm's) reach for first, and what pays
   most often, by the catalogue's rows. They are tried first, in that order, whatever the audit
   estimated. channels-last comes after compile, not before it: on an H100 (s50) inductor gained
   as much without it (resnet 2.40x, convnext 1.57x, timm's test_efficientnet 3.81x) as on top
   of it (2.45x, 1.56x, 3.59x), so channels-last kept first (1.05x on test_efficientnet) would
   have held the compiled stack 6% below compile alone.
2. **Then the others by evidence**: the audit's findings on this step (each finding names the
   levers that fix it; its expected saving is the finding's priced saving as a share of the
   step) and the catalogue (every lever whose ``applies`` says yes on this workload; its expected
   saving its measured effect in the committed catalogue); the largest first; for a lever both
   name, the audit's figure (of this step); on a tie the audit's candidates first, then the
   catalogue's, then levers with no figure at all, by id.
3. **Left out, each with its reason**: levers whose measured regime says they lose for speed: a
   lever every catalogue row of which measured slower (the checkpointing levers trade speed for
   memory: ``ac-full`` 0.76x), or one that says so itself for this model (``Lever.slower_here``,
   which then judges it instead of rows of other shapes: the fused loss without a fused kernel
   or at a vocabulary it was measured slower at, the optimizer-state levers' per-parameter
   update against a fused or foreach AdamW, float8 on narrow matmuls); levers that
   change nothing the step computes (``Lever.observes_only``); levers that do not apply; GPU-only
   levers on a CPU; levers on the factory's parameters.

Levers that exclude each other (two forms of compile, two checkpointing policies, a pair that
fails together) form one *group*: the search tries the members as alternatives at the place of
the group's first member and keeps at most one of them. A candidate may carry options
(``compile-model:mode=default``): its lever id is the part before the first ``:``. A group may
end with *fallback* forms (:data:`FALLBACK_FORMS`: per-block compile under CUDA graphs, then
compile-model's CUDA graphs without inductor), tried in that order only where none of the
group's other forms paid, and only until one of them pays; until one does, the other forms' kill
line keeps :data:`FALLBACK_SHARE` of the time for them.

A script (``levers tune -- python train.py``) has no factory: a lever that changes the
factory's parameters (raise-batch, the batch) is left out there as needing one.

This module is pure: the workload is seen only through ``applies_of(lever) -> reason | None``
and ``slower_of(lever) -> reason | None``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from statistics import median
from typing import Any

from levers.audit.recommend import CONFLICTS, COVERS, lever_ids
from levers.levers.lever import lever_id_of

# levers of which a stack holds at most one: they do the same job in different ways. The
# speed forms are alternatives for the same saving (the audit measures each where it measures
# one); the memory forms trade speed for memory, so the fastest is not the one to pick
SPEED_FORMS: tuple[frozenset[str], ...] = (
    frozenset({"compile-blocks", "compile-model"}),
    # the two float8 recipes: which pays depends on the shapes, so tune measures both
    frozenset({"float8", "float8-rowwise"}),
    # three layouts of the same padded batches: a stack holds one (packing unpads what
    # pad-to-multiple rounds, and pad-to-multiple has no padding left after packing)
    frozenset({"packing", "padding-free", "pad-to-multiple"}),
)
MEMORY_FORMS: tuple[frozenset[str], ...] = (
    frozenset({"ac-full", "ac-selective", "ac-budget"}),
    # two sizes of Adam's moments (bf16, 8-bit): an optimizer's state is kept one way at a time
    frozenset({"adamw-bf16-state", "adamw-8bit"}),
)
EXCLUSIVE: tuple[frozenset[str], ...] = SPEED_FORMS + MEMORY_FORMS
# what the peers and a performance engineer reach for first, tried first on a GPU in this order:
# whole-model compile (compile-model picks CUDA graphs where the step is static; its default
# mode is tried beside it there), per-block compile, a convnet's channels-last on top of the
# compile form kept, float8 on the compiled blocks
PEER_FORMS: tuple[str, ...] = (
    "compile-model", "compile-blocks", "compile-model:mode=default",
    "compile-model:mode=reduce-overhead", "compile-model:backend=cudagraphs", "channels-last",
    "float8", "float8-rowwise", "compile-loss",
)
# the same, per-block compile first: where the step's two sides do not fit the GPU together,
# each A/B builds, checks and times them one at a time, and the budget holds few A/Bs. A per-block
# compile compiles each distinct block once, the whole model's compile all of it: on an H100
# (s51) 12.2 s against 30.1 s a selection on ministral3, 8.1 s against 25.6 s on stablelm, and
# glm_moe_dsa's whole-model selection took 148 s of a 3-minute budget (s50), where the per-layer
# peer ran 1.465x against `model.compile()`'s 1.178x (s51; 1.374x against 1.431x in s50)
BLOCKS_FIRST_ORDER: tuple[str, ...] = ("compile-blocks", *(
    form for form in PEER_FORMS if form != "compile-blocks"))
# the levers that change what the compile forms would compile (the precision of the step's
# matmuls, an MoE's experts as grouped matmuls), tried before the peers' forms on a GPU, in this
# order (the experts' cast applies to grouped matmuls)
BEFORE_COMPILE: tuple[str, ...] = ("autocast-bf16", "experts-grouped-mm", "grouped-mm-autocast")
# of those, the ones tried first only where the audit of this step found what they fix (fp32
# matmuls, fp32 grouped matmuls): elsewhere they take their place by evidence, after the peers'
# forms. The experts' cast, first on the strength of the catalogue's 2.22x (another mixtral's
# shape, H200), measured 1.003x on the zoo's mixtral and 0.999x on glm_moe_dsa, whose step the
# audit did not find in fp32, and its two A/Bs there took 108 s of a 3-minute budget (H100, s51)
AUDIT_FIRST: tuple[str, ...] = ("autocast-bf16", "grouped-mm-autocast")
BEFORE_COMPILE_SOURCE = (
    "it changes what compile compiles (the precision of the matmuls, the experts' "
    "implementation): tried before the compile forms, which then compile the step so"
)
# the fallback form among the peers' forms (the others of FALLBACK_FORMS are placed before it)
PEERS_FALLBACK = "compile-model:backend=cudagraphs"
PEER_SOURCE = (
    "a peer's form (whole-model or per-block compile, a convnet's channels-last, float8 on it): "
    "tried first"
)
# the forms that record the step as CUDA graphs (compile-model's own choice where the step is
# static; its fallback), and the form that compiles the same programs without them: where the
# graphs fail on a step (a module that keeps a graph's output as an attribute, which the next
# replay overwrites: timm's convit_tiny, transformers' ibert), the search tries that form next
# and not the fallback, which records the same graphs
GRAPH_FORMS: tuple[str, ...] = (
    "compile-model", "compile-model:mode=reduce-overhead", "compile-model:backend=cudagraphs",
    "compile-model:mode=max-autotune", "compile-blocks:mode=reduce-overhead",
)
WITHOUT_GRAPHS_FORM = "compile-model:mode=default"
# forms tried last, after every later group, each in place of the form of its own lever that the
# stack holds, and only where the budget is the default's or more (:data:`LATE_FORMS_BUDGET_S`):
# the compile form kept, compiled again with inductor's autotuning (its matmul and convolution
# templates timed on this step's shapes against the vendor libraries', the fastest kept), which
# none of the peers' recipes uses and whose first step compiles for minutes. Whole-model compile
# autotunes under CUDA graphs (which skip what they cannot capture); per-block compile without
# them (each block's program is called many times a step, its graphs would be one pool per
# block). Not tried where no form of its lever was kept (it compiles the same program, for
# longer; on the zoo's mistral per-block compile ran 1.62x where whole-model compile ran 1.41x,
# H100, s58: the autotuned whole model is not the per-block form's rival), nor where a form's
# CUDA graphs failed on the step (the whole model's). On a GPU (H100, s59) the autotuned blocks
# paid on neither model tried: BERT 1.001x, ibert 1.082x at selection and 1.010x on confirmation
LATE_FORMS: tuple[str, ...] = (
    "compile-model:mode=max-autotune", "compile-blocks:mode=max-autotune-no-cudagraphs",
)
LATE_FORMS_BUDGET_S = 600.0
# forms tried only where no other form of their group paid, in this order, each with what it
# is; once one pays, the others are not tried. Both compile in seconds where inductor's whole
# model may compile for minutes (timm's inception_resnet_v2: ~150 s on an H100 in s65, ~210 s
# on an H200, more than a 3-minute budget once the forms before took their share):
# - each repeated block's program replayed as CUDA graphs, the code between the blocks eager: a
#   compile of one program per kind of block, with inductor's fusion inside it. On
#   inception_resnet_v2 (H100, s65, 1324b75, batch 64) it ran 1.871x [1.858, 1.878] eager after
#   a warm-up of 27 s, where whole-model reduce-overhead compile ran 3.04x after 150 s and the
#   blocks compiled without graphs ran 0.68x (s47);
# - the step's own kernels replayed as CUDA graphs, without inductor (a trace, no fusion). It
#   pays where eager's launches bound the step; on inception_resnet_v2 it ran 1.045x [0.974,
#   1.167] (H100, s47) and 1.17x (H100, s64), where reduce-overhead compile ran 3.2x and 3.97x
FALLBACK_FORMS: dict[str, str] = {
    "compile-blocks:mode=reduce-overhead": (
        "each repeated block's program replayed as CUDA graphs, the code between the blocks "
        "eager (one block's compile per kind of block, rather than the whole model's): tried "
        "where no form of compile paid in the time it had"
    ),
    "compile-model:backend=cudagraphs": (
        "the step's own kernels replayed as CUDA graphs, without inductor (a trace of seconds "
        "rather than a compile of minutes, but no fusion): tried where no inductor form of "
        "compile paid in the time it had"
    ),
}
# the share of the time left when a group with a fallback form starts that its other forms'
# kill line keeps for the fallback's selection and confirmation, while none of them has paid.
# At 0.4 (72 s of 3 minutes) the blocks under CUDA graphs were selected on inception_resnet_v2
# in 34.4 s (1.864x) and their confirmation, a fresh build compiled again, was stopped at 37.6 s
# inside its first step (H100, s66, f783213): nothing kept, where the kernels-as-graphs form
# alone had been kept at 1.173x (s64). 0.45 keeps 81 s for the two A/Bs and leaves the other
# forms 99 s of 3 minutes, more than any first whole-model compile A/B of the committed H200
# rows took (85 s)
FALLBACK_SHARE = 0.45
MEASURED_SLOWER_PREFIX = "measured slower"
GPU_ONLY_PREFIX = "its speed-up exists only on a GPU"
OBSERVES_ONLY = (
    "it changes nothing the step computes (it only observes it: a metric, a guard), so there is "
    "no speed to find in it; apply it for what it reports"
)
NEEDS_FACTORY = (
    "it needs a factory: it changes the factory's batch parameter, and a script builds its "
    "batches itself; wrap the model, optimizer and step in a factory (README.md, Workloads) and "
    "run levers tune path/to/train.py:factory, or change the script's own batch size and compare"
)


@dataclass(frozen=True)
class Candidate:
    lever: str
    expected: float | None  # expected saving as a share of the step (0.1: 10% faster)
    source: str  # where the expectation comes from, in words


@dataclass(frozen=True)
class Skipped:
    lever: str
    reason: str


def speed_alternatives(lever: str) -> tuple[str, ...]:
    """The other forms of ``lever`` that do the same job for speed (compile-model for
    compile-blocks), sorted; empty for a lever with none."""
    return tuple(sorted(
        other for group in SPEED_FORMS if lever in group for other in group if other != lever
    ))


def conflicts() -> dict[frozenset[str], str]:
    """Pairs of levers that fail together (the audit's table), with why."""
    return dict(CONFLICTS)


def exclusive_with(lever: str, others: Iterable[str]) -> str | None:
    """The first of ``others`` that ``lever`` cannot be stacked with, or None."""
    pairs = conflicts()
    ident = lever_id_of(lever)
    for other in others:
        other_id = lever_id_of(other)
        if other == lever:
            continue
        if other_id == ident:  # two forms of one lever (its options differ)
            return other
        if any({ident, other_id} <= group for group in EXCLUSIVE):
            return other
        if frozenset({ident, other_id}) in pairs:
            return other
    return None


def covered_by(lever: str, stack: Iterable[str]) -> str | None:
    """The lever of ``stack`` that already does what ``lever`` does (a regional compile fuses
    the norms a fused-norm lever targets), or None: the audit's table. A fallback form
    (compile-model's CUDA graphs without inductor) fuses nothing, so covers nothing."""
    ident = lever_id_of(lever)
    return next((other for other in stack if other not in FALLBACK_FORMS
                 and ident in COVERS.get(lever_id_of(other), ())), None)


def audit_expectations(
    findings: Sequence[Any], step_ms: float
) -> dict[str, tuple[float, str]]:
    """lever -> (expected share, source) from the findings that name it (the largest saving)."""
    out: dict[str, tuple[float, str]] = {}
    for finding in findings:
        cost = getattr(finding, "cost", None)
        saved_ms = cost.saved_ms if cost is not None else 0.0
        share = saved_ms / step_ms if step_ms > 0 else 0.0
        # a saving whose fixed side is estimated (a measured "now" less an estimated share of
        # it: DTYPE003's float8 saving on a GPU capture) is an estimate, as HOST001's is
        how = (cost.fixed_provenance or cost.provenance) if cost is not None else "unpriced"
        for lever in lever_ids(finding):
            if lever not in out or share > out[lever][0]:
                out[lever] = (share, f"audit {finding.code}: {saved_ms:.3g} ms {how}")
    return out


def catalogue_expectations(rows: Iterable[Any]) -> dict[str, tuple[float, str]]:
    """lever -> (expected share, source) from the catalogue's single-lever rows that ran: the
    median tokens/s ratio less 1 (negative for a lever measured slower)."""
    ratios: dict[str, list[float]] = {}
    for row in rows:
        if row.status != "ok" or row.tokens_per_s_ratio is None or len(row.levers) != 1:
            continue
        ratios.setdefault(row.lever, []).append(float(row.tokens_per_s_ratio))
    return {
        lever: (median(values) - 1.0, f"catalogue: {median(values):.2f}x tokens/s "
                f"(median of {len(values)} measurement{'s' if len(values) > 1 else ''})")
        for lever, values in ratios.items()
    }


def catalogue_slower(rows: Iterable[Any]) -> dict[str, str]:
    """lever -> why, for the levers every single-lever catalogue row of which measured slower
    (CI95 of the tokens/s ratio below 1): their measured regime says they lose for speed."""
    effects: dict[str, list[Any]] = {}
    for row in rows:
        if row.status != "ok" or row.tokens_per_s_ratio is None or len(row.levers) != 1:
            continue
        effects.setdefault(row.lever, []).append(row)
    out = {}
    for lever, measured in effects.items():
        if all(row.effect == "slower" for row in measured):
            ratios = sorted(float(row.tokens_per_s_ratio) for row in measured)
            shapes = "; ".join(sorted({f"{row.workload} {row.shape}" for row in measured})[:2])
            out[lever] = (
                f"the catalogue measured it slower every time it timed it: {median(ratios):.2f}x "
                f"tokens/s (median of {len(ratios)}, {ratios[0]:.2f}-{ratios[-1]:.2f}x; {shapes})"
            )
    return out


def check_ids(registry: Mapping[str, Any], ids: Iterable[str]) -> None:
    """Refuse an id the catalogue does not hold (ValueError, with the ids it holds)."""
    for name in ids:
        lever_id = lever_id_of(name)
        if ":" in name and lever_id in registry:
            raise ValueError(
                f"levers tune tries each lever as it is, without options ({name!r} has some); "
                f"leave them out (--lever {lever_id}), or A/B the lever with them: levers ab "
                f"WORKLOAD --lever {name}"
            )
        if name not in registry:
            raise ValueError(
                f"unknown lever {name!r}; available: {', '.join(sorted(registry))} "
                "(levers list shows them)"
            )


def candidates(
    registry: Mapping[str, Any],
    applies_of: Callable[[Any], str | None],
    *,
    findings: Sequence[Any] = (),
    step_ms: float = 0.0,
    catalogue_rows: Iterable[Any] = (),
    on_gpu: bool = False,
    only: Sequence[str] | None = None,
    exclude: Sequence[str] = (),
    ab_prefix: str = "levers ab WORKLOAD",
    from_audit: Mapping[str, tuple[float, str]] | None = None,
    factory: bool = True,
    slower_of: Callable[[Any], str | None] | None = None,
    forms: Mapping[str, Sequence[str]] | None = None,
    blocks_first: bool = False,
) -> tuple[list[Candidate], list[Skipped]]:
    """The levers to try, in the order of the module docstring, and those left out with why.

    ``only`` restricts the search to these ids (``--lever``); ``exclude`` leaves ids out
    (``--exclude``). Unknown ids in either are refused (ValueError) before anything runs.
    ``ab_prefix`` is the ``levers ab`` command of this workload (spec and ``--set`` items), for
    the levers that must be proven on their own. ``from_audit`` gives the audit's expectations
    already computed (:func:`audit_expectations`, in the process that ran the audit) in place of
    ``findings``; ``factory=False`` (a script) leaves out the levers on the factory's parameters.
    ``slower_of(lever)`` says why a lever would lose for speed on this model (its
    ``slower_here``), if it would; ``forms`` names other forms of a lever to try beside it
    (``{"compile-model": ["compile-model:mode=default"]}`` where compile-model's own choice is
    CUDA graphs). ``blocks_first``: per-block compile before whole-model compile, where each A/B
    is dear (:data:`BLOCKS_FIRST_ORDER`). A lever named in ``only`` is tried whatever its measured
    regime.
    """
    peer_forms = BLOCKS_FIRST_ORDER if blocks_first else PEER_FORMS
    check_ids(registry, [*(only or ()), *exclude])
    if from_audit is None:
        from_audit = audit_expectations(findings, step_ms)
    rows = list(catalogue_rows)
    from_catalogue = catalogue_expectations(rows)
    slower = catalogue_slower(rows)
    tried: list[tuple[tuple, Candidate]] = []
    skipped: list[Skipped] = []
    for lever_id in sorted(registry):
        lever = registry[lever_id]
        if only is not None and lever_id not in only:
            continue
        if lever_id in exclude:
            skipped.append(Skipped(lever_id, "left out with --exclude"))
            continue
        reason = _left_out(lever, applies_of, on_gpu, ab_prefix, factory)
        if reason is None and only is None:
            reason = _measured_slower(lever, slower, slower_of)
        if reason is not None:
            skipped.append(Skipped(lever_id, reason))
            continue
        if lever_id in from_audit:
            (share, source), tier = from_audit[lever_id], 0
        elif lever_id in from_catalogue:
            (share, source), tier = from_catalogue[lever_id], 1
        else:
            share, source, tier = None, "no audit finding or catalogue measurement", 2
        peer = on_gpu and lever_id in peer_forms
        if on_gpu and lever_id in BEFORE_COMPILE and (tier == 0 or lever_id not in AUDIT_FIRST):
            # before the peers' forms, in their own order
            key: tuple = (0, BEFORE_COMPILE.index(lever_id) - len(BEFORE_COMPILE))
            source = f"{BEFORE_COMPILE_SOURCE}; {source}"
        elif peer:
            # first, in the peers' order, whatever was estimated
            key = (0, peer_forms.index(lever_id))
            source = f"{PEER_SOURCE}; {source}"
        else:
            # the largest expected saving first; on a tie the audit's (of this step) first
            key = (1, -round(share if share is not None else 0.0, 6), tier, lever_id)
        tried.append((key, Candidate(lever_id, share, source)))
        for rank, form in enumerate((forms or {}).get(lever_id, ()), start=1):
            # a peer's form at its place among them (inductor's default mode after the
            # per-block compile: on most steps it is the CUDA-graph form less its replay)
            if form in LATE_FORMS:  # after every peer's form: the group's last
                form_key: tuple = (0, len(peer_forms), rank)
            elif peer and form in FALLBACK_FORMS and form not in peer_forms:
                # the fallbacks in their own order, just before the peers' fallback form
                form_key = (0, peer_forms.index(PEERS_FALLBACK) - 1,
                            1 + list(FALLBACK_FORMS).index(form))
            elif peer and form in peer_forms:
                form_key = (0, peer_forms.index(form))
            else:
                form_key = (*key, rank)
            what = FALLBACK_FORMS.get(form)
            tried.append((form_key, Candidate(
                form, share, f"another form of {lever_id}: {what}" if what else
                f"another form of {lever_id}; {source}",
            )))
    ordered = [c for _, c in sorted(tried, key=lambda kc: kc[0])]
    return after_their_base(ordered, registry), skipped


def _measured_slower(
    lever: Any, slower: Mapping[str, str], slower_of: Callable[[Any], str | None] | None
) -> str | None:
    """Why the lever's measured regime says it loses for speed here, or None. A lever that pays
    only on top of another (``measured_on``) is not judged by its rows alone (its own check,
    taken on top of that other, still counts: float8 on narrow matmuls); one that judges
    its own regime on this model (``slower_here``) is judged by that, not by catalogue rows
    taken on other shapes (the fused loss's row at a 32k vocabulary says nothing of a 256k one)."""
    try:
        here = slower_of(lever) if slower_of is not None else None
    except Exception:  # noqa: BLE001 - a check that fails says nothing: the A/B will tell
        here = None
    if here:
        return f"{MEASURED_SLOWER_PREFIX} in this regime: {here}"
    if getattr(lever, "measured_on", ()):
        return None
    if getattr(lever, "slower_here", None) is not None and slower_of is not None:
        return None
    if lever.id in slower:
        return (
            f"{MEASURED_SLOWER_PREFIX}: {slower[lever.id]}; not a speed lever there (try it "
            f"with --lever {lever.id} if this step differs)"
        )
    return None


def after_their_base(ordered: Sequence[Candidate], registry: Mapping[str, Any]) -> list[Candidate]:
    """``ordered`` with each lever that pays only on top of others (``measured_on``: float8 on
    compile-blocks) moved after the last of those among the candidates, so that the greedy search
    tries it on top of them rather than alone."""
    out = list(ordered)
    for candidate in ordered:
        base = getattr(registry.get(lever_id_of(candidate.lever)), "measured_on", ())
        ids = [c.lever for c in out]
        last = max((ids.index(b) for b in base if b in ids), default=-1)
        if last > ids.index(candidate.lever):
            out.remove(candidate)
            out.insert(last, candidate)  # the base moved up by one: after it
    return out


def _left_out(
    lever: Any, applies_of: Callable[[Any], str | None], on_gpu: bool, ab_prefix: str,
    factory: bool,
) -> str | None:
    if getattr(lever, "choose_params", None) is not None and not factory:
        return NEEDS_FACTORY
    if getattr(lever, "choose_params", None) is not None:
        return (
            "it changes the factory's parameters (the batch), so its steps are not the "
            f"baseline's; prove it on its own with {ab_prefix} --lever {lever.id}"
            + ("" if on_gpu or getattr(lever, "runs_on_cpu", True) else " on a GPU")
        )
    if getattr(lever, "needs_gpu", False) and not on_gpu:
        return f"{GPU_ONLY_PREFIX}; run levers tune on one"
    try:
        reason = applies_of(lever)
    except Exception as exc:  # noqa: BLE001 - a lever whose check fails on this model is left out
        return f"its applies check raised {type(exc).__name__}: {exc}"
    if reason is not None and f"{lever.id}:" in reason:
        # it asks for options (ac-budget's budget), which a search does not choose
        said = f"does not apply without options: {reason}; levers tune tries each lever as it is"
        return f"{said}: A/B it with them, {ab_prefix} --lever {lever.id}:..." if factory else said
    if reason is not None:
        return f"does not apply: {reason}"
    if getattr(lever, "observes_only", False):
        return OBSERVES_ONLY
    return None


def groups(ordered: Sequence[Candidate]) -> list[list[Candidate]]:
    """The candidates as groups of alternatives, in the order of each group's first member."""
    out: list[list[Candidate]] = []
    for candidate in ordered:
        for group in out:
            if any(exclusive_with(candidate.lever, [member.lever]) for member in group):
                group.append(candidate)
                break
        else:
            out.append([candidate])
    return out
