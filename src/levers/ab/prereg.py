"""The pre-registration file: a TOML template, and its parsing and validation.

A pre-registration states, before any data, the question, the design, the kill lines, the
numbered expectations (read, direction, size, confidence) and the decision rule. Once frozen
(see ``freeze.py``) it may only grow by ``[[amendments]]`` tables appended at its end; an
amendment may override ``design`` and ``kill`` keys (applied in order), never expectations.

The file is read with ``tomllib`` (Python 3.11+, else the ``tomli`` backport) and written by
hand: the template is the only thing levers writes, and it needs no TOML library.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

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
    "steps": 50,
    "warmup": 5,
    "parity_steps": 3,
    "resamples": 10_000,
    "seed": 0,
}
KILL_KEYS = ("nonfinite_loss", "mem_gate_gib", "time_budget_s")
TOP_LEVEL_KEYS = ("question", "reads", "design", "kill", "expectations", "decision", "amendments")
CONFIDENCES = ("low", "medium", "medium-high", "high", "open")


class PreregError(LeversError):
    """The pre-registration file is malformed or was edited after it was frozen."""


@dataclass(frozen=True)
class Expectation:
    id: int
    read: str
    direction: str  # "lower", "higher", "same"
    size: float  # relative change the whole CI must clear (0.05 = 5%)
    confidence: str
    text: str


@dataclass(frozen=True)
class Amendment:
    text: str
    date: str | None
    design: dict[str, Any]
    kill: dict[str, Any]


@dataclass(frozen=True)
class Prereg:
    question: str
    reads: tuple[str, ...]
    design: dict[str, Any]  # DESIGN_DEFAULTS, then the file, then each amendment
    kill: dict[str, Any]
    expectations: tuple[Expectation, ...]
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
    least one, ids unique); shared by step-time and run pre-registrations."""
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
    missing = [k for k in ("id", "read", "direction", "size", "confidence", "text") if k not in raw]
    require(not missing, where, f"an expectation lacks {', '.join(missing)}")
    exp = Expectation(
        raw["id"], raw["read"], raw["direction"], raw["size"], raw["confidence"], raw["text"]
    )
    tag = f"expectation {exp.id!r}"
    require(isinstance(exp.id, int) and exp.id > 0, where, f"{tag}: id must be a positive integer")
    require(exp.read in READS, where, f"{tag}: read must be one of {sorted(READS)}")
    require(exp.direction in DIRECTIONS, where, f"{tag}: direction must be one of {DIRECTIONS}")
    require(
        exp.read != "parity" or exp.direction == "same",
        where,
        f"{tag}: the parity read takes direction 'same'",
    )
    require(
        isinstance(exp.size, (int, float)) and exp.size >= 0,
        where,
        f"{tag}: size is a relative change >= 0 (0.05 = 5%)",
    )
    require(
        exp.confidence in CONFIDENCES, where, f"{tag}: confidence must be one of {CONFIDENCES}"
    )
    require(isinstance(exp.text, str) and exp.text.strip() != "", where, f"{tag}: text is empty")
    return Expectation(exp.id, exp.read, exp.direction, float(exp.size), exp.confidence, exp.text)


def _check_design(design: dict[str, Any], where: str) -> None:
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


def _check_kill(kill: dict[str, Any], where: str) -> None:
    unknown = sorted(set(kill) - set(KILL_KEYS))
    require(not unknown, where, f"unknown kill keys {unknown}; known: {list(KILL_KEYS)}")
    require(
        kill.get("nonfinite_loss", True) is True,
        where,
        "kill.nonfinite_loss cannot be turned off: a NaN/inf loss always stops a run",
    )


def _amendment(raw: Any, where: str) -> Amendment:
    require(isinstance(raw, dict), where, "each [[amendments]] entry must be a table")
    unknown = sorted(set(raw) - {"text", "date", "design", "kill"})
    require(
        not unknown,
        where,
        f"an amendment may hold text, date, design and kill, not {unknown} "
        "(expectations are banked before data and never amended)",
    )
    require(
        isinstance(raw.get("text"), str) and raw["text"].strip() != "",
        where,
        "every amendment needs a text saying what changed and why",
    )
    design, kill = raw.get("design", {}), raw.get("kill", {})
    _check_design(design, where)
    _check_kill(kill, where)
    return Amendment(raw["text"], raw.get("date"), dict(design), dict(kill))


def parse_prereg(text: str, where: str = "the pre-registration") -> Prereg:
    """Validate a pre-registration's text and apply its amendments to design and kill."""
    raw = parse_toml(text, where)
    unknown = sorted(set(raw) - set(TOP_LEVEL_KEYS))
    require(not unknown, where, f"unknown top-level keys {unknown}; known: {list(TOP_LEVEL_KEYS)}")
    require(
        isinstance(raw.get("question"), str) and raw["question"].strip() != "",
        where,
        'state the question (question = "...")',
    )
    reads = raw.get("reads", list(READS))
    require(
        isinstance(reads, list) and all(r in READS for r in reads),
        where,
        f"reads must be a list drawn from {sorted(READS)}",
    )
    design_raw, kill_raw = raw.get("design", {}), raw.get("kill", {})
    _check_design(design_raw, where)
    _check_kill(kill_raw, where)
    expectations = tuple(_expectation(e, where) for e in raw.get("expectations", []))
    rule = decision_rule(raw, expectations, where)
    amendments = tuple(_amendment(a, where) for a in raw.get("amendments", []))
    design = {**DESIGN_DEFAULTS, **design_raw}
    kill = dict(kill_raw)
    for amendment in amendments:
        design.update(amendment.design)
        kill.update(amendment.kill)
    require(
        isinstance(design["baseline"], str) and design["baseline"] != "",
        where,
        'design.baseline must name the baseline workload (e.g. "demo")',
    )
    return Prereg(
        raw["question"], tuple(reads), design, kill, expectations, rule, amendments
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
