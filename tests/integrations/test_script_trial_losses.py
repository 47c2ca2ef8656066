"""The losses of one run of ``levers tune -- python train.py`` (:func:`run_trial`, here in this
process): every step's loss from the first parity step on is read, and a NaN or infinite one
stops the run where it is seen (defect N8: the timed steps of a script whose loss turned NaN
were judged as any others)."""

from __future__ import annotations

import textwrap

import pytest

from levers.integrations.script_trial import TrialArgs, run_trial

SCRIPT = textwrap.dedent("""\
    import sys
    import torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    bad_from = int(sys.argv[1])  # the first loop index whose loss is multiplied by sys.argv[2]
    for i in range(20):
        loss = model(torch.randn(4, 8)).pow(2).mean()
        if i >= bad_from:
            loss = loss * float(sys.argv[2])
        loss.backward()
        opt.step()
        opt.zero_grad()
""")
# optimizer steps 1-2 before the levers; the candidate's window: parity steps 3-4, untimed
# step 5, timed steps 6-7; the baseline's window: untimed step 8, timed steps 9-10
DESIGN = TrialArgs(out="unused", warmup=2, parity_steps=2, compile_steps=1, steps=2, rounds=1)


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    return path


def test_a_run_whose_losses_are_finite_is_complete(script):
    data = run_trial(DESIGN, ["python", str(script), "99", "1"])
    assert data["complete"] is True and "nonfinite" not in data
    assert len(data["parity_losses"]) == 2 and all(loss > 0 for loss in data["parity_losses"])
    assert [len(w["step_s"]) for w in data["windows"]] == [2, 2]


@pytest.mark.parametrize("bad_from, factor, step, side, loss", [
    (2, "nan", 3, "candidate", "nan"),  # the first parity step
    (5, "inf", 6, "candidate", "inf"),  # a timed step
    (7, "nan", 8, "baseline", "nan"),  # the other side's window
])
def test_a_nonfinite_loss_stops_the_run_at_its_step(script, bad_from, factor, step, side, loss):
    data = run_trial(DESIGN, ["python", str(script), str(bad_from), factor])
    assert data["complete"] is False
    assert data["nonfinite"] == {"step": step, "loss": loss, "side": side, "stack": []}
    assert data["num_steps"] == step  # stopped there, not run on to the end of the plan
    assert data["failed_side"] == side
    assert data["error"] == (
        f"the loss passed to backward() is {loss} at optimizer step {step} of the script, in "
        f"the {side}'s window (no levers on); the run was stopped there"
    )
