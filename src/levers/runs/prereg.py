"""The pre-registration of a training run: question, design, gates, kill lines, frozen reads.

A run pre-registration is a TOML file written before the run (``levers prereg init FILE``) and
frozen before launch (``levers prereg freeze FILE``), with the machinery ``levers ab`` uses: the
frozen text and its SHA-256 go into the append-only ``FILE.record.jsonl``; afterwards the file
only grows by ``[[amendments]]`` (which may override ``design``, ``gates`` and ``kill`` keys,
never reads, expectations or the decision rule); verification notes (``levers prereg note``) are
record events, so a slip is recorded beside the text rather than corrected in it.

:class:`levers.RunGuard` reads its kill lines and the dataset banner gate from the frozen file
(``RunGuard.from_prereg``), and ``levers compare --prereg FILE --read N`` runs a frozen read.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from levers.ab.freeze import UNCHANGED, FreezeState, check_against_frozen, freeze, sha256_text
from levers.ab.prereg import CONFIDENCES, PreregError, decision_rule, parse_toml, require
from levers.ab.record import append_event, read_record, record_path_for
from levers.runs.metric_bar import MetricBar

TOP_LEVEL_KEYS = (
    "kind",
    "question",
    "design",
    "gates",
    "kill",
    "reads",
    "expectations",
    "decision",
    "amendments",
)
KIND = "run"
KILL_KEYS = (
    "nonfinite_loss",
    "window_steps",
    "mem_gate_gib",
    "step_time_max_ratio",
    "step_time_warmup_steps",
    "metrics",
)
METRIC_KEYS = ("name", "bar", "better", "num_evals", "after_step")
GATE_KEYS = ("banner",)
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
INIT_COMMAND = "levers prereg init"


@dataclass(frozen=True)
class RunRead:
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
class RunExpectation:
    id: int
    text: str
    confidence: str


@dataclass(frozen=True)
class RunAmendment:
    text: str
    date: str | None
    overrides: dict[str, dict[str, Any]]  # section ("design", "gates", "kill") -> keys


@dataclass(frozen=True)
class RunPrereg:
    question: str
    design: dict[str, Any]  # after amendments
    gates: dict[str, Any]
    kill: dict[str, Any]
    reads: tuple[RunRead, ...]
    expectations: tuple[RunExpectation, ...]
    decision_rule: str
    amendments: tuple[RunAmendment, ...] = field(default=())

    def read(self, read_id: int) -> RunRead:
        for r in self.reads:
            if r.id == read_id:
                return r
        raise PreregError(
            f"the pre-registration has no read {read_id}; its reads: {[r.id for r in self.reads]}"
        )


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
            not unknown,
            where,
            f"unknown [[kill.metrics]] keys {unknown}; known: {METRIC_KEYS}",
        )
        require(
            isinstance(m.get("name"), str) and m["name"],
            where,
            "a metric kill line needs a name",
        )
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


def _read(raw: Any, where: str) -> RunRead:
    require(isinstance(raw, dict), where, "each [[reads]] entry must be a table")
    unknown = sorted(set(raw) - set(READ_KEYS))
    require(not unknown, where, f"unknown [[reads]] keys {unknown}; known: {READ_KEYS}")
    missing = [k for k in ("id", "name", "metric", "better", "rule") if k not in raw]
    require(not missing, where, f"a read lacks {', '.join(missing)}")
    tag = f"read {raw['id']!r}"
    require(
        isinstance(raw["id"], int) and raw["id"] > 0,
        where,
        f"{tag}: id must be a positive integer",
    )
    require(
        raw["better"] in ("lower", "higher"),
        where,
        f'{tag}: better must be "lower" or "higher"',
    )
    must_match = raw.get("must_match", [])
    require(isinstance(must_match, list), where, f"{tag}: must_match is a list of example ids")
    return RunRead(
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


def _expectation(raw: Any, where: str) -> RunExpectation:
    require(isinstance(raw, dict), where, "each [[expectations]] entry must be a table")
    missing = [k for k in ("id", "text", "confidence") if k not in raw]
    require(not missing, where, f"an expectation lacks {', '.join(missing)}")
    tag = f"expectation {raw['id']!r}"
    require(
        isinstance(raw["id"], int) and raw["id"] > 0,
        where,
        f"{tag}: id must be a positive integer",
    )
    require(
        raw["confidence"] in CONFIDENCES, where, f"{tag}: confidence must be one of {CONFIDENCES}"
    )
    require(isinstance(raw["text"], str) and raw["text"].strip(), where, f"{tag}: text is empty")
    return RunExpectation(raw["id"], raw["text"], raw["confidence"])


def _amendment(raw: Any, where: str) -> RunAmendment:
    require(isinstance(raw, dict), where, "each [[amendments]] entry must be a table")
    unknown = sorted(set(raw) - {"text", "date", "design", "gates", "kill"})
    require(
        not unknown,
        where,
        f"an amendment may hold text, date, design, gates and kill, not {unknown} (reads, "
        "expectations and the decision rule are banked before data and never amended)",
    )
    require(
        isinstance(raw.get("text"), str) and raw["text"].strip() != "",
        where,
        "every amendment needs a text saying what changed and why",
    )
    overrides = {s: dict(raw.get(s, {})) for s in ("design", "gates", "kill")}
    _check_gates(overrides["gates"], where)
    _check_kill(overrides["kill"], where)
    return RunAmendment(raw["text"], raw.get("date"), overrides)


def parse_run_prereg(text: str, where: str = "the run pre-registration") -> RunPrereg:
    """Validate a run pre-registration's text and apply its amendments."""
    raw = parse_toml(text, where)
    require(
        raw.get("kind") == KIND,
        where,
        f'not a run pre-registration (kind = "{KIND}" missing); an A/B pre-registration is run '
        "by levers ab --prereg",
    )
    unknown = sorted(set(raw) - set(TOP_LEVEL_KEYS))
    require(not unknown, where, f"unknown top-level keys {unknown}; known: {list(TOP_LEVEL_KEYS)}")
    require(
        isinstance(raw.get("question"), str) and raw["question"].strip() != "",
        where,
        'state the question (question = "...")',
    )
    design, gates, kill = raw.get("design", {}), raw.get("gates", {}), raw.get("kill", {})
    require(isinstance(design, dict), where, "[design] must be a table")
    _check_gates(gates, where)
    _check_kill(kill, where)
    reads = tuple(_read(r, where) for r in raw.get("reads", []))
    read_ids = [r.id for r in reads]
    require(len(set(read_ids)) == len(read_ids), where, f"read ids repeat: {read_ids}")
    expectations = tuple(_expectation(e, where) for e in raw.get("expectations", []))
    rule = decision_rule(raw, expectations, where)
    amendments = tuple(_amendment(a, where) for a in raw.get("amendments", []))
    design, gates, kill = dict(design), dict(gates), dict(kill)
    for amendment in amendments:
        design.update(amendment.overrides["design"])
        gates.update(amendment.overrides["gates"])
        kill.update(amendment.overrides["kill"])
    return RunPrereg(
        raw["question"], design, gates, kill, reads, expectations, rule, amendments
    )


def guard_settings(prereg: RunPrereg) -> dict[str, Any]:
    """The RunGuard arguments a pre-registration's kill lines and gates give."""
    kill = prereg.kill
    settings: dict[str, Any] = {
        "metric_bars": tuple(
            MetricBar(
                m["name"],
                float(m["bar"]),
                m.get("better", "lower"),
                m.get("num_evals", 3),
                m.get("after_step", 0),
            )
            for m in kill.get("metrics", [])
        ),
        "mem_gate_gib": kill.get("mem_gate_gib"),
        "step_time_max_ratio": kill.get("step_time_max_ratio"),
        "step_time_warmup_steps": kill.get("step_time_warmup_steps", 0),
        "banner": prereg.gates.get("banner"),
    }
    if "window_steps" in kill:
        settings["window_steps"] = kill["window_steps"]
    return settings


# ---- frozen state ------------------------------------------------------------------------------


def freeze_run_prereg(path: str | os.PathLike) -> tuple[RunPrereg, FreezeState]:
    """Validate and freeze a run pre-registration (or freeze its appended amendment)."""
    return freeze(path, parse=parse_run_prereg, init_command=INIT_COMMAND)


def frozen_state(path: str | os.PathLike, *, freeze_command: str) -> FreezeState:
    """The freeze state of a pre-registration that must be frozen and unchanged since.

    Refuses a file that was never frozen, one with an amendment not frozen yet, and one whose
    frozen text was edited.
    """
    path = Path(path)
    if not path.is_file():
        raise PreregError(f"no pre-registration at {path}")
    text = path.read_text(encoding="utf-8")
    record = record_path_for(path)
    frozen = [e for e in read_record(record) if e.get("event") == "freeze"]
    if not frozen:
        raise PreregError(
            f"{path} is not frozen: freeze it before the run with: {freeze_command} {path}"
        )
    last = frozen[-1]
    if sha256_text(last["text"]) != last["sha256"]:
        raise PreregError(
            f"the last freeze event in {record} does not match its own hash; the record was "
            "altered by hand and can no longer vouch for the pre-registration"
        )
    status = check_against_frozen(text, last["text"], str(path))  # raises on an edit
    if status != UNCHANGED:
        raise PreregError(
            f"{path} has an amendment that is not frozen yet: freeze it with: "
            f"{freeze_command} {path}"
        )
    return FreezeState(
        last["sha256"], last["num_bytes"], UNCHANGED, last["num_amendments"], str(record)
    )


def load_frozen_run_prereg(path: str | os.PathLike) -> tuple[RunPrereg, FreezeState]:
    """The run pre-registration, refused unless it is frozen and unchanged since."""
    state = frozen_state(path, freeze_command="levers prereg freeze")
    prereg = parse_run_prereg(Path(path).read_text(encoding="utf-8"), str(path))
    return prereg, state


def append_note(path: str | os.PathLike, text: str) -> dict[str, Any]:
    """Append a verification note to the record of a frozen pre-registration."""
    if not text.strip():
        raise PreregError(
            "a verification note needs text saying what was checked and what it showed",
        )
    state = frozen_state(path, freeze_command="levers prereg freeze")
    event = {
        "event": "note",
        "at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "prereg_sha256": state.sha256,
        "text": text,
    }
    append_event(state.record_path, event)
    return event


# ---- the template ------------------------------------------------------------------------------

TEMPLATE = '''\
# levers run pre-registration. Fill it in BEFORE the run, then freeze it:
#   levers prereg freeze THIS_FILE
# Its text and hash go into THIS_FILE.record.jsonl, and levers.RunGuard.from_prereg(THIS_FILE)
# refuses a file that is not frozen or was edited since. After freezing, edit nothing: append an
# amendment (it may override design, gates and kill keys) and freeze again:
#
#   [[amendments]]
#   date = "YYYY-MM-DD"
#   text = "what changed, why, and what the incident was"
#   kill = { mem_gate_gib = 78.0 }
#
# Record what you verified during the run (a banner read, a first-steps check) as a note:
#   levers prereg note THIS_FILE "what was checked and what it showed"

kind = "run"

question = """
What does this run answer? (the parent run, its numbers, and the gap this run should close)
"""

[design]
# the frozen design: every flag that defines the run, stated exactly
text = """
One run: --resume CHECKPOINT, --steps N, --seed S (the checkpoint trained on seed S0),
every other flag identical to the parent run.
"""
seed = 1
# checkpoint_seed = 0

[gates]
# the dataset banner: counts the data pipeline must report before step 1 (any deviation aborts)
banner = { datasets = 0, episodes = 0, frames = 0 }

[kill]
nonfinite_loss = true          # always on: a NaN/inf loss stops the run
window_steps = 100             # steps per memory / step-time window
mem_gate_gib = 71.0            # the windowed peak allocated may not exceed this
step_time_max_ratio = 1.5      # a window's median step time against the first window's
step_time_warmup_steps = 0     # steps before the first (reference) window

# a probe metric worse than its bar for num_evals evals in a row, after after_step
[[kill.metrics]]
name = "eval_loss"
bar = 10.0
better = "lower"
num_evals = 3
after_step = 1000

# Frozen reads, each run later with: levers compare --prereg THIS_FILE --read ID
# (paired per-example bootstrap CI95 of candidate - baseline, seed 0, 10,000 resamples;
# IMPROVED if the CI lies entirely on the better side of 0, DAMAGED if entirely on the worse
# side, PARITY if it contains 0)
[[reads]]
id = 1
name = "primary"
metric = "eval_loss"
better = "lower"
baseline = "evals/parent.npz"
candidate = "evals/this_run.npz"
must_match = []                # integrity rows whose values must match exactly
rule = "IMPROVED if CI95 entirely below 0; PARITY if it spans 0; DAMAGED if entirely above"

# Numbered expectations, banked before data. confidence: low | medium | medium-high | high | open
[[expectations]]
id = 1
text = "No kill line fires; the run completes."
confidence = "high"

[[expectations]]
id = 2
text = "Read 1 is IMPROVED."
confidence = "medium"

[decision]
rule = """
Read 1 IMPROVED => the new endpoint replaces the parent.
Read 1 PARITY or DAMAGED => the parent stands; bank the result.
"""
'''


def template() -> str:
    return TEMPLATE
