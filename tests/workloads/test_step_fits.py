"""A built-in workload whose step cannot fit the machine is refused before it is built, and a
built-in's failing step is not the user's to fix (defect N23: llama at seq_len=1e9 ran for 54 s,
then failed on an allocation with "fix the step" and a traceback of levers' own files)."""

from __future__ import annotations

import functools

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from levers.capture import capture_step
from levers.cli import main
from levers.errors import StepError
from levers.workloads import _params, _runtime, llama, zoo


def test_a_llama_too_large_for_the_host_is_refused_before_it_is_built():
    with pytest.raises(ValueError) as info:
        llama.build(seq_len=10**9)
    message = str(info.value)
    assert "one training step at size=tiny, batch_size=2, seq_len=1,000,000,000 holds at least" in (
        message
    )
    assert "of this host" in message and "lower batch_size or seq_len" in message


def test_under_levers_memory_s_fake_tensors_nothing_is_refused():
    # the prediction answers "does not fit" itself, with the figures
    with FakeTensorMode():
        workload = llama.build(seq_len=10**9)
    assert workload.params["seq_len"] == 10**9


def test_every_built_in_checks_its_step():
    with pytest.raises(ValueError, match="holds at least"):
        zoo.build(model="nanogpt", batch_size=10**9)
    # and lets the sizes that run here through
    _runtime.check_step_fits(
        "tiny", llama.step_floor(llama.SIZES["tiny"]), torch.device("cpu"), torch.float32, "x"
    )


def test_the_command_line_refuses_it_at_once(capsys):
    assert main(["audit", "llama", "--set", "batch_size=100000000", "--no-memory-model"]) == 2
    err = capsys.readouterr().err
    assert "workload 'llama': one training step at size=tiny, batch_size=100,000,000" in err


def test_a_built_in_step_that_fails_is_not_the_user_s_to_fix(monkeypatch):
    workload = llama.build()
    # the step fails inside levers' own workload code (as an allocation would, in its forward)
    monkeypatch.setattr(_runtime, "autocast", functools.partial(_params.positive_int, "width"))
    with pytest.raises(StepError) as info:
        capture_step(workload, warmup=0, timed=0)
    message = str(info.value)
    assert message.startswith("the step of the built-in workload 'llama-tiny' raised ValueError")
    assert "lower batch_size or seq_len" in message and "fix the step" not in message
    assert info.value.user_traceback is None  # levers' frames are no lead for the user
