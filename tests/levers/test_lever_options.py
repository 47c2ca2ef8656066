"""A lever's options are checked when the lever is named, before anything is built, and a spec's
text reaches the lever as the values it names (levers.levers._compile_options for the compile
levers' torch.compile options, levers.levers._option_values for every lever's)."""

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
    "spec, said",
    [
        ("ac-selective:mm_flops_threshold=big", "mm_flops_threshold must be a number of FLOPs"),
        ("ac-selective:mm_flops_threshold=inf", "mm_flops_threshold must be a number of FLOPs"),
        ("fused-linear-cross-entropy:kernel=ligr", "kernel='ligr' is not one of auto, liger"),
        ("fused-linear-cross-entropy:chunk_rows=-3", "chunk_rows='-3' is not a whole number"),
        ("fused-linear-cross-entropy:chunk_rows=2.5", "chunk_rows='2.5' is not a whole number"),
        ("liger-kernels:rope=maybe", "rope='maybe' is not true or false"),
        ("raise-batch:margin=lots", "margin='lots' is not a share of the GPU's memory"),
        ("raise-batch:margin=2", "margin='2' is not a share of the GPU's memory"),
        ("raise-batch:max_batch_size=x", "max_batch_size='x' is not a whole number"),
        ("raise-batch:max_evaluations=0", "max_evaluations='0' is not a whole number"),
        ("raise-batch:gpu=h900", "gpu 'h900' is not a known GPU or a memory budget"),
    ],
)
def test_a_wrong_option_of_another_lever_is_refused_when_it_is_named(spec, said):
    lever = spec.split(":")[0]
    with pytest.raises(LeverNotFound, match=f"{lever}: {said}"):
        find_specs(spec)


@pytest.mark.parametrize(
    "spec",
    [
        "ac-selective:mm_flops_threshold=1e9",
        "fused-linear-cross-entropy:kernel=chunked:chunk_rows=4096",
        "liger-kernels:rope=false:fused_linear_cross_entropy=true",
        "raise-batch:gpu=h200:margin=0.1:max_batch_size=64:max_evaluations=8",
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


def test_liger_kernels_reads_false_as_off(monkeypatch):
    from levers.levers import liger_kernels

    given = {}

    def apply_fn(model, rope, swiglu, rms_norm, cross_entropy, fused_linear_cross_entropy):
        given.update(rope=rope, swiglu=swiglu, fused_linear_cross_entropy=fused_linear_cross_entropy)

    monkeypatch.setattr(liger_kernels, "_apply_function", lambda model_type: apply_fn)
    model = torch.nn.Linear(2, 2)
    model.config = type("Config", (), {"model_type": "llama"})()
    target = levers.levers.lever.Target(
        model=model, optimizer=None, step=None,
        options={"rope": "false", "fused_linear_cross_entropy": "true"},
    )
    liger_kernels.patch(target)()
    # text, as the command line gives it: "false" would otherwise be truthy and turn RoPE on
    assert given == {"rope": False, "swiglu": True, "fused_linear_cross_entropy": True}


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
