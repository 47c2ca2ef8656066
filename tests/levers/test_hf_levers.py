"""Levers on Hugging Face models built from configs: parity off vs on, reasons, undo."""

from __future__ import annotations

import pytest
import torch

import levers
from levers.levers import REGISTRY, load_all
from levers.levers._find import rms_norm_sites
from levers.levers.lever import NotApplicable
from levers.workloads import hf

from lever_parity import assert_close, assert_restored, run_steps, state_of

transformers = pytest.importorskip("transformers")
load_all()

ARCHS = ("llama", "qwen2", "gemma")


@pytest.mark.parametrize("arch", ARCHS)
def test_rms_norm_fused_finds_every_norm_and_keeps_the_loss(arch):
    workload = hf.build(arch=arch)
    sites = rms_norm_sites(workload.model)
    # two per decoder layer and the final norm (2 layers at size=tiny); gemma's is 1 + weight
    assert len(sites) == 5
    assert {s.weight_offset for s in sites} == ({1.0} if arch == "gemma" else {0.0})
    assert {s.output_rule for s in sites} == ({"input"} if arch == "gemma" else {"promote"})
    levers.apply(workload, "rms-norm-fused")
    assert rms_norm_sites(workload.model) == []
    assert_close(run_steps(workload), run_steps(hf.build(arch=arch)), REGISTRY["rms-norm-fused"].tolerance)


@pytest.mark.parametrize("arch", ("llama", "gemma"))
def test_rms_norm_fused_keeps_the_module_dtype_semantics(arch):
    model = hf.build(arch=arch).model
    norm = rms_norm_sites(model)[0].module
    x = torch.randn(2, 3, norm.weight.shape[0]).to(torch.bfloat16)
    expected = norm(x)
    levers.apply(model, "rms-norm-fused")
    got = norm(x)
    # llama: weight (fp32) * x_hat.to(bf16) is fp32; gemma: (x_hat * (1 + w)).type_as(x) is bf16
    assert got.dtype == expected.dtype == (torch.bfloat16 if arch == "gemma" else torch.float32)
    assert torch.allclose(got.float(), expected.float(), rtol=1e-2, atol=1e-2)


def test_rms_norm_fused_finds_a_user_norm_by_what_it_computes():
    class Scaler(torch.nn.Module):  # no "norm" in the name, an unusual eps attribute
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.rand(8) + 0.5)
            self.epsilon = 1e-6

        def forward(self, x):
            return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.epsilon))

    class NotANorm(Scaler):
        def forward(self, x):
            return self.weight * x

    model = torch.nn.Sequential(Scaler(), NotANorm(), torch.nn.RMSNorm(8))
    assert [s.path for s in rms_norm_sites(model)] == ["0"]
    x = torch.randn(4, 8)
    expected = model(x)
    with levers.apply(model, "rms-norm-fused"):
        assert torch.allclose(model(x), expected, rtol=1e-5, atol=1e-6)
    assert "forward" not in vars(model[0])


def test_rms_norm_fused_leaves_a_norm_that_never_applies_its_weight():
    # Falcon-Mamba's weightless norms keep a dummy weight of ones (a buffer, 128 wide) and
    # normalise inputs of other widths (4): taken for a norm of that weight, the fused call
    # raised "expected input with shape [*, 128]" in the first step (CPU arch sweep)
    class Weightless(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.variance_epsilon = 1e-6
            self.weight = torch.nn.Buffer(torch.ones(128), persistent=False)

        def forward(self, x):
            x32 = x.float()
            return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
                    ).type_as(x)

    model = torch.nn.Sequential(Weightless())
    assert rms_norm_sites(model) == []
    with pytest.raises(NotApplicable, match="no unfused RMSNorm"):
        levers.apply(model, "rms-norm-fused")


def test_rms_norm_fused_leaves_a_gated_norm_to_its_own_forward_when_given_the_gate():
    class GatedNorm(torch.nn.Module):  # Zamba2's and Mamba2's form: x * silu(gate), then the norm
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.rand(8) + 0.5)
            self.variance_epsilon = 1e-6

        def forward(self, x, gate=None):
            if gate is not None:
                x = x * torch.nn.functional.silu(gate)
            x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
            return self.weight * x

    norm = GatedNorm()
    x, gate = torch.randn(4, 8), torch.randn(4, 8)
    with_gate, without = norm(x, gate), norm(x)
    with levers.apply(norm, "rms-norm-fused"):
        assert torch.allclose(norm(x, gate), with_gate, rtol=1e-5, atol=1e-6)
        assert torch.allclose(norm(x, gate=gate), with_gate, rtol=1e-5, atol=1e-6)
        assert torch.allclose(norm(x), without, rtol=1e-5, atol=1e-6)


def test_rms_norm_fused_says_why_not_on_gpt2():
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2))
    with pytest.raises(NotApplicable, match="no unfused RMSNorm"):
        levers.apply(model, "rms-norm-fused")


@pytest.mark.parametrize("arch", ARCHS)
def test_fused_linear_cross_entropy_matches_the_model_loss(arch):
    workload = hf.build(arch=arch, seq_len=40)
    before = state_of(workload.model)
    levers.apply(workload, "fused-linear-cross-entropy").undo()
    assert_restored(workload.model, before)
    levers.apply(workload, "fused-linear-cross-entropy", kernel="chunked", chunk_rows=16)
    assert_close(
        run_steps(workload), run_steps(hf.build(arch=arch, seq_len=40)),
        REGISTRY["fused-linear-cross-entropy"].tolerance,
    )


def _tiny_llama(vocab_size: int):
    import transformers

    config = transformers.LlamaConfig(vocab_size=vocab_size, hidden_size=16, intermediate_size=32,
                                      num_hidden_layers=1, num_attention_heads=2)
    return transformers.LlamaForCausalLM(config)


def test_the_fused_loss_judges_its_own_regime_by_kernel_and_vocabulary(monkeypatch):
    from levers.levers import fused_linear_cross_entropy as flce
    from levers.levers.lever import Target

    lever = REGISTRY["fused-linear-cross-entropy"]
    small, large = _tiny_llama(512), _tiny_llama(2 * flce.MEASURED_VOCAB + 1)
    # on the CPU it runs the chunked kernel, whatever the vocabulary
    for model in (small, large):
        assert "chunked PyTorch kernel" in lever.slower_here(Target(model=model))
    # with a fused kernel: the vocabulary it was measured slower at, and up to twice it, is that
    # regime; a larger one is not known to lose
    monkeypatch.setattr(flce, "available_kernel", lambda device, requested: "liger")
    why = lever.slower_here(Target(model=small))
    assert "0.98x tokens/s at a 32,000-token vocabulary" in why and "512 is that regime" in why
    assert lever.slower_here(Target(model=large)) is None


def _labelled_step(model, optimizer, labels):
    def step():
        loss = model(input_ids=labels.clamp(min=0), labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    return step


@pytest.mark.parametrize("lever_id", ("fused-linear-cross-entropy", "loss-valid-rows"))
def test_loss_levers_skip_ignored_rows_with_the_same_loss(lever_id):
    torch.manual_seed(0)
    labels = torch.randint(0, 512, (2, 24))
    labels[:, 14:] = -100  # padding
    traces = []
    for lever_on in (False, True):
        workload = hf.build()
        workload.step = _labelled_step(workload.model, workload.optimizer, labels)
        if lever_on:
            levers.apply(workload, lever_id, kernel="chunked", chunk_rows=7)
        traces.append(run_steps(workload))
    assert_close(traces[1], traces[0], REGISTRY[lever_id].tolerance)


def test_fused_linear_cross_entropy_on_gpt2():
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).eval()  # no dropout: two forwards compare
    ids = torch.randint(0, 100, (2, 12))
    expected = model(input_ids=ids, labels=ids).loss
    with levers.apply(model, "fused-linear-cross-entropy", kernel="chunked", chunk_rows=5):
        out = model(input_ids=ids, labels=ids)
        assert out.logits is None
        assert torch.allclose(out.loss, expected, rtol=1e-5)
        assert model(input_ids=ids).logits.shape == (2, 12, 100)  # no labels: the original


def test_fused_linear_cross_entropy_says_why_not():
    from levers.workloads import llama

    with pytest.raises(NotApplicable, match="not a Hugging Face model"):
        levers.apply(llama.build(), "fused-linear-cross-entropy")
    with pytest.raises(NotApplicable, match="needs CUDA"):
        levers.apply(hf.build(), "fused-linear-cross-entropy", kernel="liger")


def test_fused_linear_cross_entropy_refuses_a_head_whose_logits_are_changed_after_it():
    """RecurrentGemma soft-caps its logits (``config.logits_soft_cap``, a name the config check
    did not know): the fused loss over the head's raw logits dropped the cap. Found by
    bench/arch_sweep.py (DAMAGED on recurrent_gemma)."""
    from levers.workloads import arch

    workload = arch.build(model="recurrent_gemma")
    with pytest.raises(NotApplicable, match=r"its forward changes the logits after the head "
                       r"\(logits = nn.functional.tanh\(logits / cap\) \* cap\)"):
        levers.apply(workload, "fused-linear-cross-entropy", kernel="chunked")
    # the loss lever that keeps the head applies: its loss gets the capped logits
    levers.apply(workload, "loss-valid-rows").undo()


def test_the_fused_loss_refuses_a_head_with_a_forward_of_its_own():
    # Dory's DoryLMHead is an nn.Linear whose forward scales each token's logit by a learned
    # weight: the fused loss took it for a plain head and dropped the scale (DAMAGED, grad norm
    # 0.133 off the float64 run, in the CPU arch sweep)
    from levers.workloads import arch

    workload = arch.build(model="dory")
    with pytest.raises(NotApplicable, match=r"its lm_head \(DoryLMHead\) computes more than "
                       r"hidden @ weight.T \(a forward of its own\): the fused loss computes"):
        levers.apply(workload, "fused-linear-cross-entropy", kernel="chunked")
    # the loss lever that calls the head itself applies: its loss gets the scaled logits
    levers.apply(workload, "loss-valid-rows").undo()


def test_sdpa_attention_switches_an_eager_hf_model():
    workload = hf.build(attn="eager")
    before = state_of(workload.model)
    levers.apply(workload, "sdpa-attention").undo()
    assert workload.model.config._attn_implementation == "eager"
    assert_restored(workload.model, before)
    levers.apply(workload, "sdpa-attention")
    assert workload.model.config._attn_implementation == "sdpa"
    assert_close(run_steps(workload), run_steps(hf.build(attn="sdpa")), 1e-5)
    with pytest.raises(NotApplicable, match="no eager attention"):
        levers.apply(hf.build(attn="sdpa"), "sdpa-attention")


def test_sdpa_cudnn_backend_applies_to_sdpa_models_only():
    workload = hf.build()
    with levers.apply(workload, "sdpa-cudnn-backend"):
        assert_close(run_steps(workload), run_steps(hf.build()), 1e-5)
    with pytest.raises(NotApplicable, match="does not call"):
        levers.apply(hf.build(attn="eager"), "sdpa-cudnn-backend")
