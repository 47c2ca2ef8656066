"""The bottleneck section: every op of a built-in workload's capture in exactly one class, by
name and by call; the classes sum to the step (estimated on a CPU capture, measured on a GPU
one); the bound follows the memory model's headroom."""

from __future__ import annotations

import dataclasses
import functools
from collections import Counter

import pytest

from levers.audit.options import AuditOptions
from levers.audit.bottleneck import (
    ATTENTION, CLASSES, ELEMENTWISE, EXPERTS, LAUNCH, LOSS, MATMULS, MEMORY_BOUND, NORMS,
    OPTIMIZER, ROUTING, THROUGHPUT_BOUND, UNKNOWN, classify_ops, explain_gap, step_bottleneck,
    tokens_per_s_ratio,
)
from levers.audit.config import PredictedMemory, make_config
from levers.audit.cost.step import estimated_step_us
from levers.capture import capture_step
from levers.loader import load_workload

GIB = 1 << 30


@functools.cache
def hf_tiny():
    pytest.importorskip("transformers")
    return capture_step(load_workload("hf", {"size": "tiny"}), warmup=1, timed=0)


@functools.cache
def demo():
    return capture_step(load_workload("demo", {}), warmup=1, timed=0)


def _by_class(capture):
    classes = classify_ops(capture)
    assert len(classes) == len(capture.ops)
    return Counter((cls, op.name) for cls, op in zip(classes, capture.ops) if not op.is_view)


def test_hf_llama_ops_are_assigned_to_their_classes():
    counts = _by_class(hf_tiny())
    names = {name: {cls for (cls, n) in counts if n == name} for (_, name) in counts}
    # every matmul of the 2-layer llama is a projection (SDPA runs its own kernel): 7 per layer
    # plus the head, forward (15) and backward (30)
    assert counts[(MATMULS, "aten.mm.default")] == 45
    assert names["aten.mm.default"] == {MATMULS}
    assert names["aten._scaled_dot_product_flash_attention_for_cpu.default"] == {ATTENTION}
    assert names["aten._scaled_dot_product_flash_attention_for_cpu_backward.default"] == {ATTENTION}
    assert names["aten._log_softmax.default"] == {LOSS}
    assert names["aten.nll_loss_backward.default"] == {LOSS}
    assert names["aten._fused_adamw_.default"] == {OPTIMIZER}
    # HF's LlamaRMSNorm is a hand-written chain: 5 norms (2 per layer and the final one)
    assert counts[(NORMS, "aten.rsqrt.default")] == 5
    assert names["aten.rsqrt.default"] == {NORMS}
    assert names["aten.silu.default"] == {ELEMENTWISE}
    assert names["aten.neg.default"] == {ELEMENTWISE}  # RoPE's rotate_half
    assert names["aten.embedding.default"] == {ELEMENTWISE}


@pytest.mark.parametrize("which", ["hf", "demo"])
def test_classes_sum_to_the_estimated_step(which):
    capture = hf_tiny() if which == "hf" else demo()
    config = make_config(capture, AuditOptions.checked(gpu="h200"))
    b = step_bottleneck(capture, config)
    assert [c.name for c in b.classes] == list(CLASSES)
    assert sum(c.num_ops for c in b.classes if c.name != LAUNCH) == len(capture.ops)
    assert sum(c.time_ms for c in b.classes) == pytest.approx(b.step_ms, rel=1e-12)
    assert b.step_ms == pytest.approx(estimated_step_us(capture, config) / 1e3, rel=1e-12)
    assert b.provenance == "estimated"
    # on a CPU capture the launch gaps are the roofline's 2 us per kernel
    kernels = sum(1 for op in capture.ops if not op.is_view)
    assert b.of(LAUNCH).time_ms == pytest.approx(kernels * 2.0 / 1e3)
    assert sum(c.share for c in b.classes) == pytest.approx(1.0)
    for c in b.classes:
        assert c.ceiling_ms <= c.time_ms + 1e-12


def test_demo_attention_and_loss_classes():
    counts = _by_class(demo())
    classes = {cls for (cls, _) in counts}
    assert {MATMULS, ATTENTION, NORMS, ELEMENTWISE, LOSS, OPTIMIZER} <= classes
    # the demo's planted eager ViT attention: its softmax is attention, not elementwise
    assert (ATTENTION, "aten._softmax.default") in counts
    assert (ELEMENTWISE, "aten._softmax.default") not in counts


def test_measured_classes_sum_to_the_measured_step_with_idle():
    capture = hf_tiny()
    ops = tuple(dataclasses.replace(op, device_us=0.0 if op.is_view else 3.0) for op in capture.ops)
    busy_us = 3.0 * sum(1 for op in ops if not op.is_view)
    env = {**capture.env, "device": "cuda:0", "device_name": "NVIDIA H200"}
    timing = dataclasses.replace(capture.timing, step_s=(2 * busy_us / 1e6,))
    gpu = dataclasses.replace(capture, ops=ops, env=env, timing=timing)
    b = step_bottleneck(gpu, make_config(gpu))
    assert b.provenance == "measured" and b.gpu_title == "NVIDIA H200 SXM"
    assert b.step_ms == pytest.approx(2 * busy_us / 1e3)
    assert b.of(LAUNCH).time_ms == pytest.approx(busy_us / 1e3)  # the idle half of the step
    assert sum(c.time_ms for c in b.classes) == pytest.approx(b.step_ms)
    assert b.of(MATMULS).time_ms == pytest.approx(45 * 3.0 / 1e3)


def _memory(reserved_gib, usable_gib=139):
    return PredictedMemory(
        gpu="h200", usable_bytes=usable_gib * GIB, num_steps=2,
        peak_allocated_bytes=reserved_gib * GIB, peak_reserved_bytes=reserved_gib * GIB,
        activation_bytes=GIB, checkpointing_applicable=False,
    )


@pytest.mark.parametrize(
    "reserved,bound", [(30, THROUGHPUT_BOUND), (130, MEMORY_BOUND), (150, MEMORY_BOUND)]
)
def test_bound_follows_the_predicted_headroom(reserved, bound):
    capture = hf_tiny()
    config = make_config(capture, AuditOptions.checked(gpu="h200"), memory=_memory(reserved))
    b = step_bottleneck(capture, config)
    assert b.bound == bound
    assert b.free_bytes == (139 - reserved) * GIB


def test_bound_unknown_without_a_prediction_and_gap_sentence():
    capture = hf_tiny()
    b = step_bottleneck(capture, make_config(capture, AuditOptions.checked(gpu="h200")))
    assert b.bound == UNKNOWN and b.free_bytes is None
    assert b.ceiling_mfu > b.mfu
    assert "launch-and-idle" in explain_gap(b)


def test_tokens_per_s_model():
    capture = hf_tiny()
    b = step_bottleneck(capture, make_config(capture, AuditOptions.checked(gpu="h200")))
    assert tokens_per_s_ratio(b, 2, 2) == pytest.approx(1.0)
    fixed, step = b.fixed_ms, b.step_ms
    expected = (8 / (fixed + (step - fixed) * 4)) / (2 / step)
    assert tokens_per_s_ratio(b, 2, 8) == pytest.approx(expected)


@functools.cache
def mixtral_tiny():
    pytest.importorskip("transformers")
    return capture_step(load_workload("zoo", {"model": "mixtral"}), warmup=1, timed=0)


def test_a_mixture_of_experts_has_its_experts_and_routing_as_classes_of_their_own():
    """Issue 22: the audit names the expert GEMMs' share; the router's ops are routing."""
    capture = mixtral_tiny()
    classes = classify_ops(capture)
    names = Counter((cls, op.name.split(".")[1]) for cls, op in zip(classes, capture.ops))
    assert names[(EXPERTS, "_grouped_mm")] > 0  # forward, and backward's two per projection
    assert not [n for (cls, n) in names if n == "_grouped_mm" and cls != EXPERTS]
    assert names[(ROUTING, "topk")] > 0 and names[(ROUTING, "_softmax")] > 0
    for cls, op in zip(classes, capture.ops):
        if cls == EXPERTS:
            assert ".experts" in op.module
    # the expert matmuls count their FLOPs (torch's registry has no grouped_mm formula)
    experts = step_bottleneck(capture, make_config(capture)).of(EXPERTS)
    assert experts.flops > 0 and experts.bound == "FLOP"
    # a dense model has neither class
    dense = Counter(classify_ops(hf_tiny()))
    assert dense[EXPERTS] == 0 and dense[ROUTING] == 0


def test_grouped_matmul_flops_are_one_matmul_over_all_rows():
    from levers.capture.ops import grouped_mm_flops

    assert grouped_mm_flops((10, 8), (3, 8, 6)) == 2 * 10 * 8 * 6  # tokens x experts' weights
    assert grouped_mm_flops((8, 10), (10, 6)) == 2 * 8 * 10 * 6  # weight gradient, groups on K
    assert grouped_mm_flops((3, 4, 8), (3, 8, 6)) == 2 * 3 * 4 * 8 * 6  # batched groups


def test_a_class_s_rate_is_compared_with_the_peak_of_its_own_dtype():
    # an fp32 step measured on a GPU: its matmul row's ceiling is at fp32's peak, and so is the
    # rate its efficiency is read against (it read bf16's, mixing two peaks: defect N11)
    import torch

    from levers import Workload

    model = torch.nn.Linear(256, 256, bias=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.ones(256, 256)

    def step():
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()

    capture = capture_step(Workload(model=model, step=step, optimizer=opt), warmup=1, timed=0)
    ops = tuple(dataclasses.replace(op, device_us=0.0 if op.is_view else 3.0) for op in capture.ops)
    env = {**capture.env, "device": "cuda:0", "device_name": "NVIDIA H200"}
    gpu = dataclasses.replace(capture, ops=ops, env=env)
    config = make_config(gpu)
    row = step_bottleneck(gpu, config).of(MATMULS)
    assert row.peak == pytest.approx(config.gpu.peak_flops("float32"))
    assert row.peak < config.gpu.peak_flops("bfloat16") / 5
