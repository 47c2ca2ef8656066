"""The ``llama`` workload: a clean decoder-only LM."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from levers.workloads import llama
from levers.workloads.llama import SIZES, LlamaLM


def test_tiny_runs_two_steps_with_finite_changing_loss():
    workload = llama.build()
    first, second = workload.step(), workload.step()
    assert math.isfinite(first.item()) and math.isfinite(second.item())
    assert first.item() != second.item()
    assert not first.requires_grad
    # A random init over a 512-token vocabulary starts near ln(512) = 6.24.
    assert 5.5 < first.item() < 7.0


def test_workload_metadata():
    workload = llama.build(seq_len=32, batch_size=3, seed="5")
    assert workload.name == "llama-tiny"
    assert workload.tokens_per_step == 96
    assert workload.params == {
        "size": "tiny",
        "device": "cpu",
        "dtype": "float32",
        "seed": 5,
        "batch_size": 3,
        "seq_len": 32,
    }
    assert workload.step().shape == ()


def test_default_tokens_per_step_by_size():
    assert llama.build().tokens_per_step == 2 * 64
    assert SIZES["1b"].batch_size * SIZES["1b"].seq_len == 8192
    assert SIZES["8b"].batch_size * SIZES["8b"].seq_len == 4096


def test_same_seed_gives_bitwise_equal_losses():
    first, second = llama.build(seed=7), llama.build(seed=7)
    for _ in range(2):
        assert torch.equal(first.step(), second.step())


def test_different_seed_gives_different_losses():
    assert not torch.equal(llama.build(seed=0).step(), llama.build(seed=1).step())


def test_attention_is_maskless_causal_sdpa_with_gqa():
    calls = []

    class RecordSDPA(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func is F.scaled_dot_product_attention:
                calls.append((args[0].shape[1], args[1].shape[1], kwargs))
            return func(*args, **(kwargs or {}))

    with RecordSDPA():
        llama.build().step()
    tiny = SIZES["tiny"]
    assert calls == [(tiny.heads, tiny.kv_heads, {"is_causal": True, "enable_gqa": True})] * (
        tiny.layers
    )


def test_step_reads_no_device_values_and_copies_nothing():
    workload = llama.build()
    seen = []

    class RecordOps(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    tokens = torch.randint(0, 512, (2, 65))
    with RecordOps():
        logits = workload.model(tokens[:, :-1])
        F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()).backward()
    assert "_local_scalar_dense" not in seen and "nonzero" not in seen


def test_bfloat16_parameters():
    workload = llama.build(dtype="bf16")
    assert {p.dtype for p in workload.model.parameters()} == {torch.bfloat16}
    assert math.isfinite(workload.step().item())


@pytest.mark.parametrize(("size", "low", "high"), [("1b", 0.9e9, 1.1e9), ("8b", 7.9e9, 8.1e9)])
def test_parameter_counts(size, low, high):
    with torch.device("meta"):
        model = LlamaLM(SIZES[size])
    assert low < sum(p.numel() for p in model.parameters()) < high


def test_8b_builds_under_fake_tensors():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        workload = llama.build(size="8b", dtype="bfloat16")
    assert workload.tokens_per_step == 4096
    assert workload.params["size"] == "8b"
    assert sum(p.numel() for p in workload.model.parameters()) == 8_030_261_248
