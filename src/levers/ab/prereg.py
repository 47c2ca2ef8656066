"""The pre-registration file: one format for ``levers ab --prereg``, ``levers compare --prereg``,
``levers prereg`` and :meth:`levers.RunGuard.from_prereg`, its parsing and validation, and the
A/B's template.

A pre-registration states, before any data, the question, the design, the kill lines, the reads,
the numbered expectations and the decision rule. Once frozen (see ``freeze.py``) it may only grow
by ``[[amendments]]`` tables appended at its end; an amendment may override ``design``, ``gates``
and ``kill`` keys (applied in order), never reads, expectations or the decision rule.

The one format (:func:`parse_preregistration`)::

    kind = "run"          # optional: marks a training run's file (gates, kill lines, reads)
    question = "..."
    reads = [...]         # step reads of the A/B ("step_time", ... or {name = "step_time"}) and
                          # quality reads ([[reads]] with id, name, metric, better, rule, files)
    [design]              # with a baseline: the A/B's design (its keys only); else free-form
    [gates]               # banner = { datasets = 880, ... }: the run guard's banner gate
    [kill]                # nonfinite_loss, mem_gate_gib; the A/B's time_budget_s; the run's
                          # window_steps, step_time_max_ratio, step_time_warmup_steps, metrics
    [[expectations]]      # id, text, confidence; read, direction, size for a read the A/B judges
    [decision]            # rule = "..."
    [[amendments]]        # text, date, design, gates, kill

An A/B file (``levers ab --init-prereg``) and a run file (``levers prereg init``) are both of
it, and so are the files each wrote before the two were one: ``levers ab`` reads the design
and step reads of any of them (:func:`parse_prereg`), ``levers compare`` and the run guard the
gates, kill lines and quality reads (:func:`levers.runs.prereg.parse_run_prereg`).

The file is read with ``tomllib`` (Python 3.11+, else the ``tomli`` backport) and written by
hand: the template is the only thing levers writes, and it needs no TOML library.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from levers.ab.design_keys import DEFAULTS_BY_KEY
from levers.ab.verdict import DIRECTIONS, READS
from levers.errors import LeversError, MissingDependency
from levers.vocab import CHANGES_NUMERICS, EXACT, FIX_SAFETIES, fix_safety

DESIGN_DEFAULTS: dict[str, Any] = {
    "baseline": None,
    "candidate": None,  # None: the baseline's spec
    "levers": [],
    "params": {},  # both sides
    "params_b": {},  # candidate only, on top of params
    "exactness": None,  # None: the levers' declared safety, else "exact"/"changes-numerics"
    **DEFAULTS_BY_KEY,  # steps, warmup, parity_steps, resamples, seed
}
AB_KILL_KEYS = ("nonfinite_loss", "mem_gate_gib", "time_budget_s")
RUN_KILL_KEYS = (
    "nonfinite_loss",
    "window_steps",
    "mem_gate_gib",
    "step_time_max_ratio",
    "step_time_warmup_steps",
    "metrics",
)
KILL_KEYS = tuple(dict.fromkeys(AB_KILL_KEYS + RUN_KILL_KEYS))
GATE_KEYS = ("banner",)
METRIC_KEYS = ("name", "bar", "better", "num_evals", "after_step")
READ_KEYS = (
    "id",
    "name",
    "metric",
    "better",
    "baseline",
    "candidate",
    "unpaired",
    "must_match",
    "id_column",
    "rule",
)
TOP_LEVEL_KEYS = (
    "kind",
    "question",
    "reads",
    "design",
    "gates",
    "kill",
    "expectations",
    "decision",
    "amendments",
)
RUN_KIND = "run"
CONFIDENCES = ("low", "medium", "medium-high", "high", "open")


class PreregError(LeversError):
    """The pre-registration file is malformed or was edited after it was frozen."""


@dataclass(frozen=True)
class Expectation:
    """A numbered expectation. ``read``, ``direction`` and ``size`` are set together, for a
    read the A/B judges; without them the expectation is checked by hand (a run's)."""

    id: int
    read: str | None
    direction: str | None  # "lower", "higher", "same"
    size: float | None  # relative change the whole CI must clear (0.05 = 5%)
    confidence: str
    text: str


@dataclass(frozen=True)
class QualityRead:
    """A frozen quality read, run by ``levers compare --prereg FILE --read ID``."""

    id: int
    name: str
    metric: str
    better: str
    baseline: str | None  # per-example metric files; relative paths are from the file's folder
    candidate: str | None
    unpaired: bool
    must_match: tuple[str, ...]
    id_column: str
    rule: str


@dataclass(frozen=True)
class Amendment:
    text: str
    date: str | None
    design: dict[str, Any]
    kill: dict[str, Any]
    gates: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Preregistration:
    """A pre-registration file as written, its amendments applied."""

    question: str
    kind: str | None
    step_reads: tuple[str, ...]  # the step reads it lists (none: the A/B judges them all)
    quality_reads: tuple[QualityRead, ...]
    design: dict[str, Any]
    gates: dict[str, Any]
    kill: dict[str, Any]
    expectations: tuple[Expectation, ...]
    decision_rule: str
    amendments: tuple[Amendment, ...] = field(default=())


@dataclass(frozen=True)
class Prereg:
    """What ``levers ab`` runs from a pre-registration."""

    question: str
    reads: tuple[str, ...]
    design: dict[str, Any]  # DESIGN_DEFAULTS, then the file, then each amendment
    kill: dict[str, Any]
    expectations: tuple[Expectation, ...]  # those with a read
    decision_rule: str
    amendments: tuple[Amendment, ...] = field(default=())


def parse_toml(text: str, where: str) -> dict[str, Any]:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ModuleNotFoundError:
            raise MissingDependency(
                "reading a pre-registration needs Python 3.11+ or the tomli package: "
                "pip install tomli"
            ) from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PreregError(f"{where} is not valid TOML: {exc}; fix the file and run again") from None


def require(cond: bool, where: str, message: str) -> None:
    """A pre-registration check: ``PreregError`` naming the file when ``cond`` is false."""
    if not cond:
        raise PreregError(f"{where}: {message}")


def decision_rule(raw: dict[str, Any], expectations: tuple, where: str) -> str:
    """The frozen decision rule, after checking the numbered expectations it decides on (at
    least one, ids unique)."""
    require(expectations != (), where, "bank at least one numbered [[expectations]] entry")
    ids = [e.id for e in expectations]
    require(len(set(ids)) == len(ids), where, f"expectation ids repeat: {ids}")
    decision = raw.get("decision", {})
    require(
        isinstance(decision, dict)
        and isinstance(decision.get("rule"), str)
        and decision["rule"].strip() != "",
        where,
        'state the decision rule ([decision] rule = "...")',
    )
    return decision["rule"]


def _expectation(raw: Any, where: str) -> Expectation:
    require(isinstance(raw, dict), where, "each [[expectations]] entry must be a table")
    missing = [k for k in ("id", "confidence", "text") if k not in raw]
    judged = [k for k in ("read", "direction", "size") if k in raw]
    if judged:  # a read the A/B judges: all three
        missing += [k for k in ("read", "direction", "size") if k not in raw]
    require(not missing, where, f"an expectation lacks {', '.join(missing)}")
    tag = f"expectation {raw['id']!r}"
    require(
        isinstance(raw["id"], int) and raw["id"] > 0, where, f"{tag}: id must be a positive integer"
    )
    if judged:
        require(raw["read"] in READS, where, f"{tag}: read must be one of {sorted(READS)}")
        require(
            raw["direction"] in DIRECTIONS, where, f"{tag}: direction must be one of {DIRECTIONS}"
        )
        require(
            raw["read"] != "parity" or raw["direction"] == "same",
            where,
            f"{tag}: the parity read takes direction 'same'",
        )
        require(
            isinstance(raw["size"], (int, float)) and raw["size"] >= 0,
            where,
            f"{tag}: size is a relative change >= 0 (0.05 = 5%)",
        )
    require(
        raw["confidence"] in CONFIDENCES, where, f"{tag}: confidence must be one of {CONFIDENCES}"
    )
    require(
        isinstance(raw["text"], str) and raw["text"].strip() != "", where, f"{tag}: text is empty"
    )
    return Expectation(
        raw["id"],
        raw.get("read"),
        raw.get("direction"),
        float(raw["size"]) if judged else None,
        raw["confidence"],
        raw["text"],
    )


def _check_design(design: Any, where: str, *, ab: bool) -> None:
    """``ab``: the design names a baseline, so it is levers ab's and holds its keys only."""
    require(isinstance(design, dict), where, "[design] must be a table")
    if not ab:
        return  # a run's design is free-form: recorded, not read
    unknown = sorted(set(design) - set(DESIGN_DEFAULTS))
    require(not unknown, where, f"unknown design keys {unknown}; known: {sorted(DESIGN_DEFAULTS)}")
    # a file written before the vocabulary was one says "numerics-changing": still read
    if design.get("exactness") is not None:
        design["exactness"] = fix_safety(design["exactness"])
    require(
        design.get("exactness") in (None, *FIX_SAFETIES),
        where,
        f'design.exactness must be "{EXACT}" or "{CHANGES_NUMERICS}"',
    )
    for key in ("params", "params_b"):
        require(isinstance(design.get(key, {}), dict), where, f"design.{key} must be a table")
    require(isinstance(design.get("levers", []), list), where, "design.levers must be a list")


def _check_kill(kill: Any, where: str) -> None:
    require(isinstance(kill, dict), where, "[kill] must be a table")
    unknown = sorted(set(kill) - set(KILL_KEYS))
    require(not unknown, where, f"unknown kill keys {unknown}; known: {list(KILL_KEYS)}")
    require(
        kill.get("nonfinite_loss", True) is True,
        where,
        "kill.nonfinite_loss cannot be turned off: a NaN/inf loss always stops a run",
    )
    for key in ("mem_gate_gib", "step_time_max_ratio"):
        value = kill.get(key)
        require(
            value is None or (isinstance(value, (int, float)) and value > 0),
            where,
            f"kill.{key} must be a positive number",
        )
    for key in ("window_steps", "step_time_warmup_steps"):
        value = kill.get(key)
        require(
            value is None or (isinstance(value, int) and value >= 0),
            where,
            f"kill.{key} must be a whole number",
        )
    metrics = kill.get("metrics", [])
    require(isinstance(metrics, list), where, "kill.metrics must be a list of [[kill.metrics]]")
    for m in metrics:
        require(isinstance(m, dict), where, "each [[kill.metrics]] entry must be a table")
        unknown = sorted(set(m) - set(METRIC_KEYS))
        require(
            not unknown, where, f"unknown [[kill.metrics]] keys {unknown}; known: {METRIC_KEYS}"
        )
        require(isinstance(m.get("name"), str) and m["name"], where, "a metric kill line needs a name")
        require(
            isinstance(m.get("bar"), (int, float)),
            where,
            f"metric {m.get('name')!r} needs a numeric bar",
        )
        require(
            m.get("better", "lower") in ("lower", "higher"),
            where,
            f"metric {m['name']!r}: better must be \"lower\" or \"higher\"",
        )


def _check_gates(gates: Any, where: str) -> None:
    require(isinstance(gates, dict), where, "[gates] must be a table")
    unknown = sorted(set(gates) - set(GATE_KEYS))
    require(not unknown, where, f"unknown gate keys {unknown}; known: {list(GATE_KEYS)}")
    banner = gates.get("banner")
    if banner is not None:
        require(
            isinstance(banner, dict)
            and all(isinstance(v, int) and not isinstance(v, bool) for v in banner.values()),
            where,
            "gates.banner must be a table of whole-number counts (datasets = 880, ...)",
        )


def _quality_read(raw: dict[str, Any], where: str) -> QualityRead:
    unknown = sorted(set(raw) - set(READ_KEYS))
    require(not unknown, where, f"unknown [[reads]] keys {unknown}; known: {READ_KEYS}")
    missing = [k for k in ("id", "name", "metric", "better", "rule") if k not in raw]
    require(not missing, where, f"a read lacks {', '.join(missing)}")
    tag = f"read {raw['id']!r}"
    require(
        isinstance(raw["id"], int) and raw["id"] > 0, where, f"{tag}: id must be a positive integer"
    )
    require(raw["better"] in ("lower", "higher"), where, f'{tag}: better must be "lower" or "higher"')
    must_match = raw.get("must_match", [])
    require(isinstance(must_match, list), where, f"{tag}: must_match is a list of example ids")
    return QualityRead(
        raw["id"],
        raw["name"],
        raw["metric"],
        raw["better"],
        raw.get("baseline"),
        raw.get("candidate"),
        bool(raw.get("unpaired", False)),
        tuple(str(i) for i in must_match),
        raw.get("id_column", "id"),
        raw["rule"],
    )


def _reads(raw: Any, where: str) -> tuple[tuple[str, ...], tuple[QualityRead, ...]]:
    """The step reads (a name, or a table with only a name and an id) and the quality reads (a
    table with a metric)."""
    require(isinstance(raw, list), where, f"reads must be a list drawn from {sorted(READS)}")
    steps, quality = [], []
    for entry in raw:
        if isinstance(entry, dict) and "metric" in entry:
            quality.append(_quality_read(entry, where))
            continue
        name = entry.get("name") if isinstance(entry, dict) else entry
        require(
            name in READS and (not isinstance(entry, dict) or set(entry) <= {"id", "name"}),
            where,
            f"reads must be a list drawn from {sorted(READS)}, or [[reads]] tables with a metric "
            "(a quality read for levers compare)",
        )
        steps.append(name)
    ids = [r.id for r in quality]
    require(len(set(ids)) == len(ids), where, f"read ids repeat: {ids}")
    return tuple(steps), tuple(quality)


def _amendment(raw: Any, where: str, *, ab_design: bool) -> Amendment:
    require(isinstance(raw, dict), where, "each [[amendments]] entry must be a table")
    unknown = sorted(set(raw) - {"text", "date", "design", "gates", "kill"})
    require(
        not unknown,
        where,
        f"an amendment may hold text, date, design, gates and kill, not {unknown} (reads and "
        "expectations are banked before data and never amended, nor is the decision rule)",
    )
    require(
        isinstance(raw.get("text"), str) and raw["text"].strip() != "",
        where,
        "every amendment needs a text saying what changed and why",
    )
    design, gates, kill = raw.get("design", {}), raw.get("gates", {}), raw.get("kill", {})
    _check_design(design, where, ab=ab_design)
    _check_gates(gates, where)
    _check_kill(kill, where)
    return Amendment(raw["text"], raw.get("date"), dict(design), dict(kill), dict(gates))


def parse_preregistration(text: str, where: str = "the pre-registration") -> Preregistration:
    """Validate a pre-registration of the one format (an A/B's, a run's or both) and apply its
    amendments."""
    raw = parse_toml(text, where)
    unknown = sorted(set(raw) - set(TOP_LEVEL_KEYS))
    require(not unknown, where, f"unknown top-level keys {unknown}; known: {list(TOP_LEVEL_KEYS)}")
    require(
        raw.get("kind") in (None, RUN_KIND), where, f'kind is "{RUN_KIND}" or left out'
    )
    require(
        isinstance(raw.get("question"), str) and raw["question"].strip() != "",
        where,
        'state the question (question = "...")',
    )
    step_reads, quality_reads = _reads(raw.get("reads", []), where)
    design_raw = raw.get("design", {})
    ab_design = isinstance(design_raw, dict) and "baseline" in design_raw
    _check_design(design_raw, where, ab=ab_design)
    gates_raw, kill_raw = raw.get("gates", {}), raw.get("kill", {})
    _check_gates(gates_raw, where)
    _check_kill(kill_raw, where)
    expectations = tuple(_expectation(e, where) for e in raw.get("expectations", []))
    rule = decision_rule(raw, expectations, where)
    amendments = tuple(
        _amendment(a, where, ab_design=ab_design) for a in raw.get("amendments", [])
    )
    design, gates, kill = dict(design_raw), dict(gates_raw), dict(kill_raw)
    for amendment in amendments:
        design.update(amendment.design)
        gates.update(amendment.gates)
        kill.update(amendment.kill)
    return Preregistration(
        raw["question"], raw.get("kind"), step_reads, quality_reads, design, gates, kill,
        expectations, rule, amendments,
    )


def parse_prereg(text: str, where: str = "the pre-registration") -> Prereg:
    """What ``levers ab`` runs: the design (defaults filled in), its kill lines, the step reads
    and the expectations it judges, from a pre-registration of the one format."""
    prereg = parse_preregistration(text, where)
    design = {**DESIGN_DEFAULTS, **prereg.design}
    require(
        isinstance(design["baseline"], str) and design["baseline"] != "",
        where,
        'design.baseline must name the baseline workload (e.g. "demo")',
    )
    return Prereg(
        prereg.question,
        prereg.step_reads or tuple(READS),
        design,
        {k: v for k, v in prereg.kill.items() if k in AB_KILL_KEYS},
        tuple(e for e in prereg.expectations if e.read is not None),
        prereg.decision_rule,
        prereg.amendments,
    )


# ---- the template --------------------------------------------------------------------------

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def toml_value(value: Any) -> str:
    """A TOML literal for the plain values a design holds."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # JSON string escapes are valid TOML basic-string escapes
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        items = (f"{_key(k)} = {toml_value(v)}" for k, v in value.items() if v is not None)
        return "{ " + ", ".join(items) + " }" if value else "{}"
    raise TypeError(f"cannot write {type(value).__name__} into a pre-registration: {value!r}")


def _key(key: str) -> str:
    return key if _BARE_KEY.match(key) else json.dumps(key)


DEFAULT_QUESTION = (
    "Does the candidate make the training step faster or smaller without changing its math?"
)
DEFAULT_EXPECTATIONS = (
    {
        "id": 1,
        "read": "parity",
        "direction": "same",
        "size": 0.0,
        "confidence": "high",
        "text": "The candidate passes the parity gate: same losses and gradient norms within "
        "tolerance.",
    },
    {
        "id": 2,
        "read": "step_time",
        "direction": "lower",
        "size": 0.0,
        "confidence": "medium",
        "text": "The candidate's step is faster: the step-time ratio's CI95 lies entirely below 1.",
    },
    {
        "id": 3,
        "read": "peak_allocated",
        "direction": "same",
        "size": 0.02,
        "confidence": "medium",
        "text": "Peak allocated memory stays within 2% of the baseline.",
    },
)
DEFAULT_DECISION = """
parity PARITY and step_time IMPROVED => adopt the candidate.
parity PARITY and step_time PARITY => adopt only if it simplifies the code; bank the null result.
parity DAMAGED, or any read DAMAGED => reject; record the evidence.
"""


def _expectations_toml(expectations: Any) -> str:
    blocks = []
    for e in expectations:
        blocks.append(
            "\n".join(
                ["[[expectations]]"]
                + [
                    f"{key} = {toml_value(e[key])}"
                    for key in ("id", "read", "direction", "size", "confidence", "text")
                ]
            )
        )
    return "\n\n".join(blocks)


def template(
    design: dict[str, Any],
    *,
    question: str | None = None,
    expectations: Any = None,
    decision_rule: str | None = None,
) -> str:
    """The text of a fresh pre-registration, with ``design`` (and optionally more) filled in."""
    d = {**DESIGN_DEFAULTS, **{k: v for k, v in design.items() if v is not None}}
    baseline = d["baseline"] or "demo"
    candidate = d["candidate"] or baseline
    rule = (decision_rule or DEFAULT_DECISION).strip("\n")
    mem_gate_line = _kill_line(
        "mem_gate_gib",
        d.get("mem_gate_gib"),
        "70.0",
        "stop if a side's peak allocated exceeds this (GPU only)",
    )
    time_budget_line = _kill_line(
        "time_budget_s", d.get("time_budget_s"), "600", "stop once the run has taken this long"
    )
    if '"""' in rule:
        raise ValueError("a decision rule cannot contain three double quotes in a row")
    return f"""\
# levers ab pre-registration. Write the question, the expectations and the decision rule
# BEFORE the first run. `levers ab --prereg THIS_FILE` freezes the file: its hash goes into
# the append-only record beside it (THIS_FILE.record.jsonl). After that, edit nothing above
# the end of the file; append an amendment instead:
#
#   [[amendments]]
#   date = "YYYY-MM-DD"
#   text = "what changed and why"
#   design = {{ steps = 100 }}   # optional: design keys to override
#   kill = {{ time_budget_s = 900 }}  # optional: kill lines to override

question = {toml_value(question or DEFAULT_QUESTION)}

# the reads judged by this comparison (each gets IMPROVED / PARITY / DAMAGED)
reads = ["step_time", "tokens_per_s", "peak_allocated", "parity"]

[design]
baseline = {toml_value(baseline)}
candidate = {toml_value(candidate)}
levers = {toml_value(list(d["levers"]))}
params = {toml_value(d["params"])}      # both sides
params_b = {toml_value(d["params_b"])}    # the candidate only, on top of params
# "exact": the same math; "changes-numerics": rounding may differ (looser parity tolerance)
exactness = {toml_value(d["exactness"] or CHANGES_NUMERICS)}
steps = {d["steps"]}                # timed steps per side, alternating baseline/candidate
warmup = {d["warmup"]}
parity_steps = {d["parity_steps"]}
resamples = {d["resamples"]}         # paired bootstrap resamples for each CI95
seed = {d["seed"]}                  # workloads, parity reseeding and bootstrap

[kill]
nonfinite_loss = true  # always on: a NaN/inf loss stops the run
{mem_gate_line}
{time_budget_line}

# Numbered expectations, banked before data. read: step_time | tokens_per_s | peak_allocated |
# parity. direction: lower | higher | same. size: the relative change the whole CI95 must clear
# (lower: CI below 1 - size; higher: above 1 + size; same: inside [1 - size, 1 + size]).
# confidence: low | medium | medium-high | high | open.

{_expectations_toml(expectations or DEFAULT_EXPECTATIONS)}

[decision]
rule = \"\"\"
{rule}
\"\"\"
"""


def _kill_line(key: str, value: Any, example: str, what: str) -> str:
    if value is None:
        return f"# {key} = {example}  # {what}"
    return f"{key} = {toml_value(value)}  # {what}"
