"""Levers on a GPU at tiny sizes: the CUDA paths (Liger, fused AdamW, inductor, cuDNN SDPA).

Run on the device machine: ``python -m pytest -m gpu tests/levers/test_levers_gpu.py``.
Under bf16 autocast, so the tolerances are bf16's (the parity of the math is checked in fp32 on
the CPU by the other tests).
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

import levers
from levers.levers.lever import NotApplicable
from levers.workloads import demo, hf

from lever_parity import assert_close, run_steps

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
BF16 = 3e-2
needs_liger = pytest.mark.skipif(
    importlib.util.find_spec("liger_kernel") is None, reason="liger-kernel not installed"
)


@needs_liger
@pytest.mark.parametrize("arch", ("llama", "qwen2"))
def test_liger_fused_linear_cross_entropy_matches_the_hf_loss(arch):
    on = hf.build(arch=arch, device="cuda")
    handle = levers.apply(on, "fused-linear-cross-entropy", kernel="liger")
    assert handle.applied == ["fused-linear-cross-entropy"]
    assert_close(run_steps(on), run_steps(hf.build(arch=arch, device="cuda")), BF16, grad_rtol=0.1)


@needs_liger
def test_liger_kernels_match_and_refuse_compile():
    on = hf.build(device="cuda")
    levers.apply(on, "liger-kernels")
    with pytest.raises(NotApplicable, match="Liger"):
        levers.apply(on, "compile-blocks")
    assert_close(run_steps(on), run_steps(hf.build(device="cuda")), BF16, grad_rtol=0.1)
    other = hf.build(device="cuda")  # another model of the type is untouched
    assert not any("liger" in type(m).__module__ for m in other.model.modules())


def test_compile_blocks_with_inductor_matches():
    torch._dynamo.reset()
    on = hf.build(device="cuda")
    levers.apply(on, "compile-blocks,fused-linear-cross-entropy,rms-norm-fused")
    assert_close(run_steps(on, 3), run_steps(hf.build(device="cuda"), 3), BF16, grad_rtol=0.1)


def test_compile_loss_with_inductor_matches_and_keeps_no_fp32_log_probabilities():
    """The loss compiled by inductor on a CUDA bf16 step (4096 tokens, a 32000 vocabulary),
    with compile-blocks: the eager step's losses and gradients to bf16's tolerance, and a lower
    peak than the eager loss, whose fp32 logits and log-probabilities are kept for backward."""
    torch._dynamo.reset()

    def peak(workload) -> tuple[list, int]:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        run = run_steps(workload, 3)
        held = torch.cuda.max_memory_allocated()
        # to the host, so that one run's copies do not sit in the other's peak
        run.losses = [loss.cpu() for loss in run.losses]
        run.grads = [{k: g.cpu() for k, g in step.items()} for step in run.grads]
        return run, held

    def mistral():  # the zoo's mistral at its full width and vocabulary, two layers
        return levers.Step("zoo", params={"model": "mistral", "size": "full", "device": "cuda",
                                          "layers": 2, "batch_size": 2}).workload()

    eager, eager_peak = peak(mistral())  # built, run and freed before the other is built
    on = mistral()
    handle = levers.apply(on, "compile-blocks,compile-loss")
    assert handle.applied == ["compile-blocks", "compile-loss"]
    compiled, compiled_peak = peak(on)
    handle.undo()
    assert_close(compiled, eager, BF16, grad_rtol=0.1)
    assert compiled_peak < eager_peak


def test_fused_optimizer_fuses_on_cuda():
    model = torch.nn.Linear(16, 16, device="cuda")
    optimizer = torch.optim.AdamW(model.parameters(), foreach=False)
    model(torch.randn(4, 16, device="cuda")).sum().backward()
    optimizer.step()  # state exists: its step counts are moved to the GPU
    with levers.apply(model, "fused-optimizer", optimizer=optimizer):
        assert optimizer.param_groups[0]["fused"]
        model(torch.randn(4, 16, device="cuda")).sum().backward()
        optimizer.step()
    assert not optimizer.param_groups[0]["fused"]


def test_demo_levers_match_the_demo_fixes_on_cuda():
    names = "sdpa-cudnn-backend,sdpa-attention,inplace-scatter,windowed-peak-metric,loss-valid-rows"
    on = demo.build(device="cuda")
    levers.apply(on, names)
    fixed = demo.build(device="cuda", fixed="suffix_attn,vit_attn,clone,peak_metric,loss")
    assert_close(run_steps(on), run_steps(fixed), BF16, grad_rtol=0.1)


def test_the_fused_loss_says_its_chunked_kernel_is_slower_on_a_gpu():
    from levers.levers import load_all
    from levers.levers.lever import target_of

    lever = load_all()["fused-linear-cross-entropy"]
    workload = hf.build(arch="llama", device="cuda")
    chunked = lever.slower_here(target_of(workload, {"kernel": "chunked"}))
    assert chunked is not None and "chunked PyTorch kernel" in chunked
    if importlib.util.find_spec("liger_kernel") is not None:
        # Liger's kernel at the tiny llama's vocabulary: the regime it was measured slower in
        fused = lever.slower_here(target_of(workload, {"kernel": "liger"}))
        assert fused is not None and "32,000-token vocabulary" in fused
    # on a CPU it runs the chunked kernel too
    assert "chunked PyTorch kernel" in lever.slower_here(target_of(hf.build(arch="llama")))
