"""The SDPA backend a target GPU would pick, and what each keeps for backward."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.nn.attention import SDPBackend, sdpa_kernel

from levers.memory import sdpa
from levers.memory.fake import trace_workload
from levers.hardware import resolve_gpu
from levers.workload import Workload

H100 = sdpa.target_for((9, 0))
A100 = sdpa.target_for((8, 0))


def _qkv(dtype=torch.bfloat16, heads=16, kv_heads=16, q_len=128, k_len=128, head_dim=64):
    with FakeTensorMode():
        q = torch.empty(2, heads, q_len, head_dim, dtype=dtype)
        k = torch.empty(2, kv_heads, k_len, head_dim, dtype=dtype)
        v = torch.empty(2, kv_heads, k_len, head_dim, dtype=dtype)
    return q, k, v


def test_default_priorities_follow_the_chip():
    assert sdpa.priority_order(H100) == ("cudnn", "flash", "efficient", "math")
    assert sdpa.priority_order(A100) == ("flash", "efficient", "math", "cudnn")


@pytest.mark.parametrize(
    "target, kwargs, mask, causal, gqa, expected",
    [
        (A100, {}, False, True, False, "flash"),
        (H100, {}, False, True, False, "cudnn"),
        (
            A100,
            {"dtype": torch.float32},
            False,
            False,
            False,
            "efficient",
        ),  # flash is fp16/bf16 only
        (A100, {}, True, False, False, "efficient"),  # flash takes no mask
        (A100, {"kv_heads": 4}, True, False, True, "math"),  # efficient: no GQA here
        (A100, {"q_len": 60, "k_len": 128}, False, True, False, "efficient"),  # causal, Lq != Lk
        (A100, {"head_dim": 68}, False, False, False, "flash"),  # not a multiple of 8: flash pads
        (A100, {"head_dim": 36, "dtype": torch.float16}, True, False, False, "math"),
    ],
)
def test_backend_choice(target, kwargs, mask, causal, gqa, expected):
    q, k, v = _qkv(**kwargs)
    attn_mask = None
    if mask:
        with FakeTensorMode():
            attn_mask = torch.zeros(1, 1, q.shape[2], k.shape[2], dtype=q.dtype)
    backend, _ = sdpa.choose_backend(q, k, v, attn_mask, 0.0, causal, gqa, target)
    assert backend == expected


def test_a_pin_is_honoured_and_its_rejections_are_reported():
    q, k, v = _qkv()
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.MATH]):
        backend, rejected = sdpa.choose_backend(q, k, v, None, 0.0, True, False, H100)
    assert backend == "flash"
    assert rejected == ("cudnn: disabled",)


def _attention_workload(device: str = "cpu", backend: SDPBackend = SDPBackend.FLASH_ATTENTION):
    model = torch.nn.Linear(64, 64, device=device)

    def step():
        x = torch.randn(2, 4, 256, 64, device=device, dtype=torch.bfloat16, requires_grad=True)
        with sdpa_kernel([backend]):
            out = F.scaled_dot_product_attention(x, x, x, is_causal=True)
        out.float().sum().backward()

    return Workload(model=model, step=step)


@pytest.mark.parametrize("backend", [SDPBackend.FLASH_ATTENTION, SDPBackend.MATH])
def test_math_keeps_the_scores_and_flash_keeps_the_logsumexp(backend):
    trace, _ = trace_workload(
        lambda: _attention_workload("cuda", backend), resolve_gpu("a100-80gb"), num_steps=1
    )
    kept = [a for a in trace.allocations if a.category == "activations"]
    scores_bytes = 2 * 4 * 256 * 256 * 4  # B*H*L*L in float32 (MATH upcasts bf16)
    if backend == SDPBackend.MATH:
        assert any(a.nbytes == scores_bytes for a in kept)
        assert {call.backend for call in trace.sdpa_calls} == {"math"}
    else:
        assert max(a.nbytes for a in kept) < scores_bytes
        assert any(a.shape == (2, 4, 256) and a.dtype == "float32" for a in kept)  # logsumexp
        assert {call.backend for call in trace.sdpa_calls} == {"flash"}


def test_the_choice_matches_an_h200_on_a_grid_of_calls():
    """Every call of the grid that SDPA was asked about on an H200 (torch 2.11, cuDNN 9.19)."""
    import json
    from pathlib import Path

    recorded = json.loads((Path(__file__).parent / "h200_sdpa_choices.json").read_text())
    names = {0: "math", 1: "flash", 2: "efficient", 3: "cudnn"}
    mismatches = []
    for row in recorded["rows"]:
        dtype, head_dim, heads, kv_heads, gqa, q_len, k_len, mask_kind, causal, layout, choice = row
        dtype = getattr(torch, dtype)
        with FakeTensorMode():

            def make(num_heads, length, layout=layout, head_dim=head_dim, dtype=dtype):
                if layout == "bhld":
                    return torch.empty(2, num_heads, length, head_dim, dtype=dtype)
                return torch.empty(2, length, num_heads, head_dim, dtype=dtype).transpose(1, 2)

            q, k, v = (make(heads, q_len), make(kv_heads, k_len), make(kv_heads, k_len))
            mask = None
            if mask_kind == "float":
                mask = torch.zeros(1, 1, q_len, k_len, dtype=dtype)
            elif mask_kind == "bool":
                mask = torch.ones(2, 1, q_len, k_len, dtype=torch.bool)
        for tensor in (q, k, v):
            tensor.requires_grad_()
        backend, _ = sdpa.choose_backend(q, k, v, mask, 0.0, causal, gqa, H100)
        if backend != names[choice]:
            mismatches.append((row, backend))
    assert len(recorded["rows"]) == 384
    assert mismatches == []


def test_a_learned_attention_bias_rules_out_cudnn_whose_backward_gives_it_no_gradient():
    """A Swin's relative position bias requires grad: cuDNN's backward has none for it, so the
    H100/H200 choice falls to the next backend that takes a mask (memory efficient)."""
    q, k, v = _qkv()
    with FakeTensorMode():
        bias = torch.empty(2, 16, 128, 128, dtype=torch.bfloat16, requires_grad=True)
        fixed = torch.empty(2, 16, 128, 128, dtype=torch.bfloat16)
    backend, rejected = sdpa.choose_backend(q, k, v, bias, 0.0, False, False, H100)
    assert backend == "efficient"
    assert "cudnn: an attention bias that requires grad" in rejected
    assert sdpa.choose_backend(q, k, v, fixed, 0.0, False, False, H100)[0] == "cudnn"


@pytest.mark.parametrize(
    ("lengths", "masked"),
    [("fixed", False), ("longtail", True)],  # no padding: SDPA's is_causal, as on a GPU
)
def test_a_hugging_face_model_builds_its_causal_mask_only_where_a_gpu_run_would(lengths, masked):
    # transformers takes a fake tensor for tracing, and while tracing it builds the [batch, 1,
    # seq, seq] mask that a real run leaves to is_causal; the prediction's fakes stand for real
    # tensors, so a step without padding must pass no mask
    pytest.importorskip("transformers")
    from levers.memory.prediction import run_prediction, source_of

    params = {"arch": "llama", "size": "tiny", "lengths": lengths}
    prediction = run_prediction(source_of("hf", params), resolve_gpu("h200"), num_steps=1)
    calls = prediction.trace.sdpa_calls
    assert calls and {c.has_mask for c in calls} == {masked}
    if not masked:
        assert all(c.is_causal for c in calls)
