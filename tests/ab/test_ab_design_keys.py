"""An A/B design's numbers are declared once: the key the user writes, the AbConfig field it sets
(the JSON record's name) and the default (issue 35)."""

from __future__ import annotations

from dataclasses import asdict

import pytest

from levers.ab import design as design_mod
from levers.ab.design_keys import DEFAULTS_BY_KEY, DESIGN_FIELDS
from levers.ab.prereg import DESIGN_DEFAULTS
from levers.ab.runner import AbConfig
from levers.cli import main
from levers.tune.measure import TrialDesign


def test_the_design_and_the_config_share_one_set_of_defaults():
    config = AbConfig()
    for key, (field, default) in DESIGN_FIELDS.items():
        assert DESIGN_DEFAULTS[key] == getattr(config, field) == default
    assert AbConfig.from_design(DESIGN_DEFAULTS) == AbConfig.from_design({}) == config


def test_a_design_keyed_as_the_user_writes_it_sets_the_recorded_fields():
    design = {"baseline": "demo", "steps": 7, "warmup": 1, "parity_steps": 0,
              "resamples": 300, "seed": 4}
    config = AbConfig.from_design(design, exactness="exact", time_budget_s=60.0)
    assert (config.num_steps, config.num_warmup, config.num_parity_steps,
            config.num_resamples, config.seed) == (7, 1, 0, 300, 4)
    assert (config.exactness, config.time_budget_s) == ("exact", 60.0)
    # the JSON record keeps AbConfig's names
    assert {"num_steps", "num_warmup", "num_parity_steps", "num_resamples", "seed"} <= set(
        asdict(config)
    )
    with pytest.raises(ValueError, match="num_steps must be at least 2"):
        AbConfig.from_design({"steps": 1})


def test_levers_ab_and_tune_map_their_designs_through_the_one_table():
    resolved, kill = design_mod.resolve({"baseline": "demo", "steps": 6}, {}, None)
    config = design_mod.config(resolved, kill, "exact")
    assert (config.num_steps, config.num_resamples) == (6, DEFAULTS_BY_KEY["resamples"])
    # tune's trial design has the design's keys as its fields
    trial = TrialDesign(steps=5, resamples=200)
    assert AbConfig.from_design(asdict(trial)).num_resamples == 200


def test_levers_ab_help_prints_the_defaults_of_the_table(capsys):
    with pytest.raises(SystemExit):
        main(["ab", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert f"default {DEFAULTS_BY_KEY['resamples']})" in help_text
    assert f"default: {DEFAULTS_BY_KEY['steps']} per side" in help_text
