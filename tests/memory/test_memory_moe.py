"""levers memory on a Hugging Face mixture of experts (issue 22): the router's integer histogram
and the experts' grouped matmul in fp32, which fake tensors refuse and CUDA runs."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

import levers  # noqa: E402
from levers.memory import fake  # noqa: E402
from levers.workloads import zoo  # noqa: E402


def test_a_mixture_of_experts_step_is_predicted_with_its_expert_outputs_and_gradients():
    plan = levers.Step("zoo", {"model": "mixtral"}).memory()
    real = zoo.build(model="mixtral").model
    assert plan.num_parameters == sum(p.numel() for p in real.parameters())
    # the experts' weights (fp32, [experts, 2 x ffn, hidden] and [experts, hidden, ffn]) are
    # parameters, and their gradients, made by the grouped matmul's backward, are counted too
    expert_bytes = sum(
        p.numel() * p.element_size() for n, p in real.named_parameters() if ".experts." in n
    )
    assert expert_bytes > 0
    assert plan.peak_allocated_bytes > 3 * expert_bytes  # weights, gradients, two moments


def test_grouped_matmul_of_fp32_experts_allocates_the_output_and_both_gradients():
    a = torch.randn(10, 8, requires_grad=True)
    b = torch.randn(3, 8, 6, requires_grad=True)
    offs = torch.tensor([3, 7, 10], dtype=torch.int32)
    out = fake._grouped_mm_any_dtype(torch._grouped_mm, (a, b), {"offs": offs})
    assert out.shape == (10, 6) and out.dtype == torch.float32
    out.sum().backward()
    assert a.grad.shape == a.shape and b.grad.shape == b.shape
    bf16 = fake._grouped_mm_any_dtype(torch._grouped_mm, (a.bfloat16(), b.bfloat16()), {"offs": offs})
    assert bf16 is NotImplemented  # the fast kernel's own fake kernel handles bf16


def test_integer_histogram_is_counted_in_the_input_dtype():
    experts = torch.tensor([0, 2, 2, 1, 2], dtype=torch.int32)
    counts = fake._integer_histc(torch.histc, (experts,), {"bins": 3, "min": 0, "max": 2})
    assert counts.dtype == torch.int32
    assert counts.tolist() == [1, 1, 3]
    assert fake._integer_histc(torch.histc, (experts.float(),), {"bins": 3}) is NotImplemented
