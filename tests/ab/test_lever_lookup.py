"""The lever lookup's errors: a lever that is not in the catalogue is LeverNotFound; one that is,
but has nothing to change on the workload, is NotApplicable and says why and what applies."""

import pytest

from levers.ab.lever_lookup import LeverNotFound, apply_levers, find_levers
from levers.errors import LeversError
from levers.levers.lever import NotApplicable
from levers.workloads import demo


def test_a_lever_that_exists_but_does_not_apply_is_not_applicable_not_not_found():
    workload = demo.build()  # its AdamW is fused already
    with pytest.raises(NotApplicable) as caught:
        apply_levers(workload, find_levers(["fused-optimizer"]))
    error = caught.value
    assert not isinstance(error, LeverNotFound)
    assert isinstance(error, LeversError) and error.exit_code == 2
    message = str(error)
    assert "fused-optimizer does not apply: it is already fused" in message
    assert "levers that apply to it:" in message and "inplace-scatter" in message
    assert "fused-optimizer," not in message.split("apply to it:")[1]


def test_a_lever_not_in_the_catalogue_is_not_found():
    with pytest.raises(LeverNotFound, match="unknown lever"):
        find_levers(["no-such-lever"])


def test_a_lever_that_predicts_memory_predicts_the_ab_s_own_candidate():
    """Defect N22: ac-budget in levers ab needed the workload named twice
    (ac-budget:budget=0.5:workload=demo)."""
    from levers.ab.lever_lookup import predicting_own_workload

    given = find_levers(["ac-budget:budget=0.5", "ac-full"])
    chosen = predicting_own_workload(given, "demo")
    assert chosen[0].options == {"budget": "0.5", "workload": "demo"}
    assert chosen[1].options == {}  # a lever that predicts nothing is left as it was
    # a workload (or the inputs) named by the user is theirs
    named = predicting_own_workload(find_levers(["ac-budget:budget=0.5:workload=hf"]), "demo")
    assert named[0].options["workload"] == "hf"


def test_ac_budget_in_an_ab_of_the_demo_needs_no_workload_option():
    import levers

    result = levers.Step("demo").ab(
        "ac-budget:budget=1.0", steps=2, warmup=0, parity_steps=1, resamples=100
    )
    assert result.decision in {"PARITY", "IMPROVED", "DAMAGED"}  # it ran: the lever applied


def test_a_budget_no_plan_fits_is_the_user_s_error_not_levers():
    """A budget below every plan's peak was a bare ValueError out of the lever's patch: an
    internal error (exit 70) from levers ab."""
    from levers.levers.handle import apply

    workload = demo.build()
    with pytest.raises(NotApplicable, match="no plan (found whose checked peak )?fits"):
        apply(workload, "ac-budget:budget=1KiB:workload=demo")
