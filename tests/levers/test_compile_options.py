"""The compile levers' options are checked when the levers are named, before anything is built,
and a spec's text reaches torch.compile as the values it names (levers.levers._compile_options)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import levers
from levers.levers.lever import LeverNotFound
from levers.levers.handle import find_specs
from levers.workloads import zoo

COMPILE_LEVERS = ("compile-model", "compile-blocks", "compile-loss")


@pytest.mark.parametrize("lever", COMPILE_LEVERS)
@pytest.mark.parametrize(
    "option, said",
    [
        ("mode=fast", "mode='fast' is not one of"),
        ("backend=indcutor", "backend='indcutor' is not a backend torch.compile knows"),
        ("dynamic=maybe", "dynamic='maybe' is not true or false"),
        ("fullgraph=perhaps", "fullgraph='perhaps' is not true or false"),
    ],
)
def test_a_wrong_compile_option_is_refused_when_the_lever_is_named(lever, option, said):
    with pytest.raises(LeverNotFound, match=f"{lever}: {said}"):
        find_specs(f"{lever}:{option}")


@pytest.mark.parametrize(
    "spec",
    [
        "compile-model:mode=auto:fullgraph=false",
        "compile-model:backend=cudagraphs",
        "compile-blocks:mode=max-autotune-no-cudagraphs:dynamic=none",
        "compile-blocks:backend=aot_eager:dynamic=False:fullgraph=true",
        "compile-loss:mode=reduce-overhead",
    ],
)
def test_the_options_torch_takes_are_accepted(spec):
    [(lever, options)] = find_specs(spec)
    assert lever.id == spec.split(":")[0] and options


def test_a_wrong_mode_is_a_user_error_of_ab_not_an_internal_one(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "levers", "ab", "demo", "--lever", "compile-blocks:mode=fast"],
        capture_output=True, text=True, cwd=tmp_path, timeout=300,
    )
    assert done.returncode == 2, done.stderr
    assert "compile-blocks: mode='fast' is not one of" in done.stderr
    assert "internal error" not in done.stderr


def test_flags_of_a_spec_reach_torch_compile_as_booleans(compile_calls):
    torch._dynamo.reset()
    workload = zoo.build(model="gpt2", layers=2)
    # text, as the command line gives it: torch would read fullgraph="false" as true
    with levers.apply(workload, "compile-blocks", backend="eager", fullgraph="false",
                      dynamic="none"):
        assert compile_calls == [{"backend": "eager", "fullgraph": False, "dynamic": None}] * 2
    compile_calls.clear()
    with levers.apply(workload, "compile-model", backend="eager", fullgraph="true",
                      dynamic="false"):
        assert compile_calls == [{"backend": "eager", "fullgraph": True, "dynamic": False}]
    torch._dynamo.reset()
