"""One search's options are one record, checked at the border and passed whole (issue 35)."""

from __future__ import annotations

import pytest

import levers
from levers.ab.record import RecordError
from levers.tune.measure import TrialDesign
from levers.tune.options import TuneOptions


def test_the_record_fills_the_defaults_and_checks_every_value(tmp_path):
    options = TuneOptions.checked(budget="90s", levers="compile-model,float8", steps=30)
    assert options.budget_s == 90.0 and options.only == ("compile-model", "float8")
    assert options.design == TrialDesign(steps=30)
    assert TuneOptions.checked() == TuneOptions()  # the defaults are declared once
    for given, said in [
        ({"budget": "soon"}, "--budget: cannot read the duration 'soon'"),
        ({"levers": "nope"}, "unknown lever 'nope'"),
        ({"exclude": ["compile-model:mode=default"]}, "without options"),
        ({"steps": 1}, "num_steps must be at least 2"),
    ]:
        with pytest.raises(ValueError, match=said):
            TuneOptions.checked(**given)
    with pytest.raises(RecordError, match="is a directory"):  # before any long work
        TuneOptions.checked(record=tmp_path)


def test_step_tune_takes_the_record_or_the_keywords_not_both():
    seen = []

    def measure(base, stack, time_budget_s, **kw):
        seen.append(stack)
        raise AssertionError("no A/B is asked for: the search is refused first")

    with pytest.raises(TypeError, match="not both"):
        levers.Step("demo").tune(options=TuneOptions(), budget="1m", measure=measure)
    assert seen == []
