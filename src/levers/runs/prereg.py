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
from levers.ab.prereg import (
    RUN_KIND,
    Amendment,
    Expectation,
    PreregError,
    QualityRead,
    parse_preregistration,
    require,
)
from levers.ab.record import append_event, read_record, record_path_for
from levers.text_files import read_utf8
from levers.runs.metric_bar import MetricBar

KIND = RUN_KIND
INIT_COMMAND = "levers prereg init"
RunRead = QualityRead  # the name this module gave a quality read before the format was one


@dataclass(frozen=True)
class RunPrereg:
    """What a training run's tools read from a pre-registration: ``levers compare`` its quality
    reads, the run guard its gates and kill lines."""

    question: str
    design: dict[str, Any]  # after amendments
    gates: dict[str, Any]
    kill: dict[str, Any]
    reads: tuple[QualityRead, ...]
    expectations: tuple[Expectation, ...]
    decision_rule: str
    amendments: tuple[Amendment, ...] = field(default=())

    def read(self, read_id: int) -> QualityRead:
        for r in self.reads:
            if r.id == read_id:
                return r
        raise PreregError(
            f"the pre-registration has no read {read_id}; its reads: {[r.id for r in self.reads]}"
        )


def parse_run_prereg(text: str, where: str = "the run pre-registration") -> RunPrereg:
    """A training run's view of a pre-registration of the one format: a file marked
    ``kind = "run"`` or holding quality reads."""
    prereg = parse_preregistration(text, where)
    require(
        prereg.kind == KIND or prereg.quality_reads != (),
        where,
        f'not a run pre-registration (kind = "{KIND}" missing, and no [[reads]] with a metric); '
        "an A/B pre-registration is run by levers ab --prereg",
    )
    return RunPrereg(
        prereg.question,
        prereg.design,
        prereg.gates,
        prereg.kill,
        prereg.quality_reads,
        prereg.expectations,
        prereg.decision_rule,
        prereg.amendments,
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
    text = read_utf8(path, PreregError)
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
    prereg = parse_run_prereg(read_utf8(path, PreregError), str(path))
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
