"""The ``hf`` workload: transformers causal LMs built from a config with random weights."""

from __future__ import annotations

import math
import sys

import pytest
import torch

from levers.errors import MissingDependency
from levers.workloads import hf

pytest.importorskip("transformers")


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma", "mistral"])
def test_tiny_builds_and_runs_two_steps(arch, attn):
    workload = hf.build(arch=arch, attn=attn)
    first, second = workload.step(), workload.step()
    assert math.isfinite(first.item()) and math.isfinite(second.item())
    assert first.item() != second.item()
    assert not first.requires_grad
    assert workload.model.config._attn_implementation == attn
    assert workload.model.config.model_type == arch
    assert workload.name == f"hf-{arch}-tiny"
    assert workload.model.training


def test_params_and_tokens_per_step():
    workload = hf.build(arch="qwen2", seq_len=16, batch_size=3)
    assert workload.tokens_per_step == 48
    assert workload.params == {
        "arch": "qwen2",
        "attn": "sdpa",
        "size": "tiny",
        "device": "cpu",
        "dtype": "float32",
        "seed": 0,
        "batch_size": 3,
        "seq_len": 16,
    }
    assert workload.step().shape == ()


def test_shapes_follow_the_size():
    config = hf.build(arch="mistral").model.config
    assert (config.hidden_size, config.num_hidden_layers, config.vocab_size) == (64, 2, 512)
    assert (config.num_attention_heads, config.num_key_value_heads) == (4, 2)
    assert config.sliding_window is None
    assert config.use_cache is False


def test_same_seed_gives_bitwise_equal_losses():
    first, second = hf.build(seed=2), hf.build(seed=2)
    for _ in range(2):
        assert torch.equal(first.step(), second.step())


def test_different_seed_gives_different_losses():
    assert not torch.equal(hf.build(seed=0).step(), hf.build(seed=1).step())


def test_bfloat16_parameters():
    workload = hf.build(dtype="bfloat16")
    assert {p.dtype for p in workload.model.parameters()} == {torch.bfloat16}
    assert torch.get_default_dtype() == torch.float32


@pytest.mark.parametrize(
    ("params", "message"),
    [
        (
            {"arch": "gpt2"},
            "arch='gpt2' is not supported; use one of: llama, qwen2, gemma, mistral",
        ),
        ({"attn": "flash_attention_2"}, "use one of: eager, sdpa"),
        ({"size": "70b"}, "use one of: tiny, 1b, 8b"),
        ({"seq_len": 0}, "seq_len must be a positive integer"),
    ],
)
def test_bad_params_raise_value_error(params, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        hf.build(**params)


def test_missing_transformers_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(MissingDependency) as info:
        hf.build()
    assert "pip install 'levers[hf]'" in str(info.value)
    assert "pip install transformers" in str(info.value)
