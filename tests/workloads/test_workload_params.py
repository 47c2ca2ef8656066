"""Parameters shared by the built-in workloads: defaults, spellings, and errors."""

from __future__ import annotations

import importlib

import pytest
import torch

from levers.workload import Workload
from levers.workloads import BUILTINS, _params

FACTORIES = {name: spec for name, spec in BUILTINS.items()}


def factory(name):
    module_name, function_name = FACTORIES[name].split(":")
    return getattr(importlib.import_module(module_name), function_name)


@pytest.mark.parametrize("name", ["demo", "llama", "hf"])
def test_builtins_resolve_to_factories_that_build_tiny_workloads(name):
    if name == "hf":
        pytest.importorskip("transformers")
    workload = factory(name)()
    assert isinstance(workload, Workload)
    assert workload.params["size"] == "tiny"
    assert workload.params["device"] == "cpu"
    assert workload.params["dtype"] == "float32"
    assert workload.params["seed"] == 0


@pytest.mark.parametrize("name", ["demo", "llama", "hf"])
@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"size": "huge"}, "size='huge' is not supported; use one of: tiny, 1b"),
        ({"device": "tpu"}, "device='tpu' is not supported; use one of: cpu, cuda"),
        ({"device": "mps"}, "device='mps' is not supported; use one of: cpu, cuda"),
        ({"dtype": "int8"}, "dtype='int8' is not supported; use one of: float32, fp32, bfloat16"),
        ({"seed": "abc"}, "seed must be an integer, got 'abc'"),
        ({"seed": True}, "seed must be an integer, got True"),
        ({"batch_size": 0}, "batch_size must be a positive integer, got 0"),
        ({"batch_size": "-2"}, "batch_size must be a positive integer, got '-2'"),
        ({"batch_size": 2.5}, "batch_size must be an integer, got 2.5"),
    ],
)
def test_bad_values_raise_value_error_listing_what_is_allowed(name, params, message):
    if name == "hf":
        pytest.importorskip("transformers")
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        factory(name)(**params)


@pytest.mark.parametrize("name", ["demo", "llama", "hf"])
def test_unknown_parameter_names_raise_type_error(name):
    with pytest.raises(TypeError, match="unexpected keyword argument 'colour'"):
        factory(name)(colour="red")


def test_demo_has_no_8b_size():
    with pytest.raises(ValueError, match="use one of: tiny, 1b$"):
        factory("demo")(size="8b")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
def test_cuda_without_a_gpu_says_what_to_do():
    with pytest.raises(ValueError, match="CUDA is not available here; use device=cpu"):
        factory("llama")(device="cuda")


def test_command_line_strings_are_accepted():
    workload = factory("llama")(seed="3", batch_size="4", seq_len="8", dtype="torch.bfloat16")
    assert workload.params == {
        "size": "tiny",
        "device": "cpu",
        "dtype": "bfloat16",
        "seed": 3,
        "batch_size": 4,
        "seq_len": 8,
    }


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("float32", torch.float32),
        ("fp32", torch.float32),
        ("bf16", torch.bfloat16),
        ("torch.float16", torch.float16),
        (torch.bfloat16, torch.bfloat16),
    ],
)
def test_dtype_spellings(value, expected):
    assert _params.dtype(value) is expected


def test_dtype_name_is_canonical():
    assert _params.dtype_name(torch.bfloat16) == "bfloat16"
    assert _params.dtype_name(torch.float16) == "float16"


def test_device_accepts_torch_device():
    assert _params.device(torch.device("cpu")) == torch.device("cpu")
