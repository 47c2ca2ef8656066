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
