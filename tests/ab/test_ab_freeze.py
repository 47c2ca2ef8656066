"""Freezing a pre-registration: edits are refused, appended amendments are accepted."""

from __future__ import annotations

import json

import pytest

from levers.ab.freeze import AMENDED, NEW, UNCHANGED, freeze, sha256_text
from levers.ab.prereg import PreregError, template
from levers.ab.record import RecordError, read_record, record_path_for

TEXT = template({"baseline": "demo", "params_b": {"fixed": "all"}})
AMENDMENT = (
    '\n[[amendments]]\ndate = "2026-01-02"\ntext = "100 steps: 50 were too noisy"\n'
    "design = { steps = 100 }\n"
)


@pytest.fixture
def prereg_file(tmp_path):
    path = tmp_path / "ab.toml"
    path.write_text(TEXT, encoding="utf-8")
    return path


def freeze_events(path):
    return [e for e in read_record(record_path_for(path)) if e["event"] == "freeze"]


def test_the_first_run_freezes_the_text_and_its_hash(prereg_file):
    prereg, state = freeze(prereg_file)
    assert state.status == NEW
    assert state.sha256 == sha256_text(TEXT)
    assert state.record_path == str(prereg_file.with_name("ab.toml.record.jsonl"))
    (event,) = freeze_events(prereg_file)
    assert event["text"] == TEXT
    assert event["sha256"] == sha256_text(TEXT)
    assert event["num_bytes"] == len(TEXT.encode())
    assert prereg.design["params_b"] == {"fixed": "all"}


def test_an_unchanged_file_is_not_frozen_again(prereg_file):
    freeze(prereg_file)
    _, state = freeze(prereg_file)
    assert state.status == UNCHANGED
    assert len(freeze_events(prereg_file)) == 1


def test_an_edit_of_frozen_text_is_refused_and_named(prereg_file):
    freeze(prereg_file)
    prereg_file.write_text(TEXT.replace("steps = 50", "steps = 20"), encoding="utf-8")
    with pytest.raises(PreregError) as info:
        freeze(prereg_file)
    message = str(info.value)
    assert "was edited after it was frozen" in message
    assert "'steps = 50                # timed steps" in message
    assert "append an [[amendments]] table" in message
    assert len(freeze_events(prereg_file)) == 1  # nothing frozen by a refused run


def test_deleting_frozen_text_is_refused(prereg_file):
    freeze(prereg_file)
    prereg_file.write_text(TEXT[: TEXT.index("[decision]")] + '[decision]\nrule = "x"\n')
    with pytest.raises(PreregError, match="edited after it was frozen"):
        freeze(prereg_file)


def test_an_appended_amendment_is_accepted_and_frozen(prereg_file):
    freeze(prereg_file)
    prereg_file.write_text(TEXT + AMENDMENT, encoding="utf-8")
    prereg, state = freeze(prereg_file)
    assert state.status == AMENDED
    assert state.num_amendments == 1
    assert prereg.design["steps"] == 100
    events = freeze_events(prereg_file)
    assert [e["sha256"] for e in events] == [sha256_text(TEXT), sha256_text(TEXT + AMENDMENT)]
    # the amendment is frozen in turn: editing it is now refused
    prereg_file.write_text(TEXT + AMENDMENT.replace("100", "120"), encoding="utf-8")
    with pytest.raises(PreregError, match="edited after it was frozen"):
        freeze(prereg_file)


def test_appended_text_that_is_not_an_amendment_is_refused(prereg_file):
    freeze(prereg_file)
    prereg_file.write_text(
        TEXT + '\n[[expectations]]\nid = 9\nread = "parity"\n'
        'direction = "same"\nsize = 0.0\nconfidence = "high"\ntext = "late"\n'
    )
    with pytest.raises(PreregError, match="does not start with an \\[\\[amendments\\]\\] table"):
        freeze(prereg_file)


def test_an_amendment_that_reopens_a_frozen_table_is_refused(prereg_file):
    freeze(prereg_file)
    sneaky = '\n[[amendments]]\ntext = "harmless"\n\n[decision.extra]\nnote = "moved the bar"\n'
    prereg_file.write_text(TEXT + sneaky, encoding="utf-8")
    with pytest.raises(PreregError, match="changes frozen tables, not only amendments"):
        freeze(prereg_file)


def test_a_record_altered_by_hand_is_refused(prereg_file):
    freeze(prereg_file)
    record = record_path_for(prereg_file)
    event = json.loads(record.read_text())
    event["text"] = event["text"].replace("steps = 50", "steps = 20")
    record.write_text(json.dumps(event) + "\n")
    prereg_file.write_text(event["text"])
    with pytest.raises(PreregError, match="does not match its own hash"):
        freeze(prereg_file)


def test_a_torn_record_is_refused(prereg_file):
    freeze(prereg_file)
    record = record_path_for(prereg_file)
    with open(record, "a") as handle:
        handle.write('{"event": "result", "trunc')
    with pytest.raises(RecordError, match="last line .* is incomplete"):
        freeze(prereg_file)


def test_a_missing_file_says_how_to_make_one(tmp_path):
    with pytest.raises(PreregError, match="levers ab --init-prereg"):
        freeze(tmp_path / "nope.toml")
