"""A lever spec's id is read in one place (issue 35: it was split by hand in seven)."""

from __future__ import annotations

import pytest

from levers.levers.lever import lever_id_of, parse_lever_spec


@pytest.mark.parametrize("spec", [
    "compile-model", "compile-model:mode=default", " ac-budget :budget=20GiB:workload=hf",
])
def test_the_id_of_a_spec_is_the_parsed_one(spec):
    assert lever_id_of(spec) == parse_lever_spec(spec)[0]


def test_an_option_without_a_value_is_refused_by_the_parser_only():
    assert lever_id_of("ac-budget:20GiB") == "ac-budget"
    with pytest.raises(ValueError, match="is not KEY=VALUE"):
        parse_lever_spec("ac-budget:20GiB")
