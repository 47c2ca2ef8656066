"""The pre-registration template and its validation."""

from __future__ import annotations

import pytest

from levers.ab.prereg import PreregError, parse_prereg, template, toml_value

GOOD = template({"baseline": "demo", "params": {"size": "tiny"}, "params_b": {"fixed": "all"}})


def test_the_template_parses_with_the_given_design():
    prereg = parse_prereg(GOOD)
    assert prereg.design["baseline"] == "demo"
    assert prereg.design["candidate"] == "demo"
    assert prereg.design["params"] == {"size": "tiny"}
    assert prereg.design["params_b"] == {"fixed": "all"}
    assert prereg.design["exactness"] == "changes-numerics"
    assert (prereg.design["steps"], prereg.design["warmup"], prereg.design["parity_steps"]) == (
        50,
        5,
        3,
    )
    assert prereg.design["resamples"] == 10_000
    assert prereg.reads == ("step_time", "tokens_per_s", "peak_allocated", "parity")
    assert prereg.kill == {"nonfinite_loss": True}
    assert [(e.id, e.read, e.direction, e.size) for e in prereg.expectations] == [
        (1, "parity", "same", 0.0),
        (2, "step_time", "lower", 0.0),
        (3, "peak_allocated", "same", 0.02),
    ]
    assert "adopt the candidate" in prereg.decision_rule
    assert prereg.amendments == ()


def test_amendments_override_design_and_kill_in_order():
    text = (
        GOOD
        + """
[[amendments]]
date = "2026-01-01"
text = "more steps: the first run was too noisy"
design = { steps = 100 }
kill = { time_budget_s = 900 }

[[amendments]]
text = "and more again"
[amendments.design]
steps = 200
"""
    )
    prereg = parse_prereg(text)
    assert prereg.design["steps"] == 200
    assert prereg.kill["time_budget_s"] == 900
    assert [a.text for a in prereg.amendments] == [
        "more steps: the first run was too noisy",
        "and more again",
    ]


@pytest.mark.parametrize(
    "value, expected",
    [
        (True, "true"),
        (3, "3"),
        (0.5, "0.5"),
        ('a "quoted" name', '"a \\"quoted\\" name"'),
        ([1, "x"], '[1, "x"]'),
        ({"size": "1b", "odd key": 2}, '{ size = "1b", "odd key" = 2 }'),
        ({}, "{}"),
    ],
)
def test_toml_values(value, expected):
    assert toml_value(value) == expected


def _replace(old: str, new: str) -> str:
    assert old in GOOD
    return GOOD.replace(old, new, 1)


@pytest.mark.parametrize(
    "text, message",
    [
        ("question = ", "not valid TOML"),
        (_replace('question = "', 'questio = "'), "unknown top-level keys \\['questio'\\]"),
        (_replace('read = "step_time"', 'read = "latency"'), "read must be one of"),
        (_replace('direction = "lower"', 'direction = "down"'), "direction must be one of"),
        (_replace('read = "step_time"', 'read = "parity"'), "parity read takes direction 'same'"),
        (_replace("size = 0.02", "size = -0.02"), "size is a relative change"),
        (_replace('confidence = "medium"', 'confidence = "sure"'), "confidence must be one of"),
        (_replace("id = 2", "id = 1"), "expectation ids repeat"),
        (_replace("steps = 50", "stepz = 50"), "unknown design keys \\['stepz'\\]"),
        (_replace("nonfinite_loss = true", "nonfinite_loss = false"), "cannot be turned off"),
        (_replace('exactness = "changes-numerics"', 'exactness = "mostly"'), "design.exactness"),
    ],
)
def test_malformed_preregistrations_are_refused(text, message):
    with pytest.raises(PreregError, match=message):
        parse_prereg(text)


def test_an_amendment_cannot_touch_expectations():
    text = GOOD + '\n[[amendments]]\ntext = "lower the bar"\nexpectations = []\n'
    with pytest.raises(PreregError, match="expectations are banked before data"):
        parse_prereg(text)


def test_an_amendment_needs_a_text():
    with pytest.raises(PreregError, match="every amendment needs a text"):
        parse_prereg(GOOD + '\n[[amendments]]\ndate = "2026-01-01"\n')


def test_a_preregistration_without_expectations_is_refused():
    text = GOOD[: GOOD.index("[[expectations]]")] + '[decision]\nrule = "x"\n'
    with pytest.raises(PreregError, match="at least one numbered"):
        parse_prereg(text)


def test_the_template_takes_its_own_question_expectations_rule_and_kill_lines():
    text = template(
        {"baseline": "demo", "time_budget_s": 300},
        question="Is A/A noise below 2%?",
        expectations=[
            {
                "id": 1,
                "read": "step_time",
                "direction": "same",
                "size": 0.02,
                "confidence": "high",
                "text": "A/A step time within 2%",
            }
        ],
        decision_rule="PARITY on every read => the noise floor is below 2%.",
    )
    prereg = parse_prereg(text)
    assert prereg.question == "Is A/A noise below 2%?"
    assert [(e.read, e.direction, e.size) for e in prereg.expectations] == [
        ("step_time", "same", 0.02)
    ]
    assert prereg.decision_rule.strip() == "PARITY on every read => the noise floor is below 2%."
    assert prereg.kill == {"nonfinite_loss": True, "time_budget_s": 300}


def test_an_older_file_spelling_numerics_changing_is_still_read():
    old = GOOD.replace('exactness = "changes-numerics"', 'exactness = "numerics-changing"')
    assert old != GOOD
    assert parse_prereg(old).design["exactness"] == "changes-numerics"


def test_the_older_spelling_reads_in_the_config_and_on_the_command_line():
    from levers.cli.ab import add_parser
    from levers.ab.runner import AbConfig
    import argparse

    assert AbConfig(exactness="numerics-changing").exactness == "changes-numerics"
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    for flag in ("--changes-numerics", "--numerics-changing"):
        assert parser.parse_args(["ab", "demo", flag]).exactness == "changes-numerics"
