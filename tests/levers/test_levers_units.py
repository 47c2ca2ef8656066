"""Levers on small models and steps: parity, reasons, undo, and the public API."""

from __future__ import annotations

import importlib.machinery
import sys
import types

import pytest
import torch
import torch.nn.functional as F

import levers
from levers.levers import REGISTRY, load_all
from levers.levers.lever import Lever, NotApplicable, Target
from levers.levers.sdpa_cudnn_backend import AdmitFused, is_causal_mask
from levers.vocab import CHANGES_NUMERICS, EXACT
from levers.workloads import demo, llama

from lever_parity import assert_close, assert_restored, run_steps, state_of

load_all()


# levers that no audit rule recommends: DTYPE003 names float8 (tensorwise, whose filter it
# mirrors); levers tune tries the rowwise recipe beside it as its alternative; no rule reads the
# convolutions' memory format (the capture records no strides): tune tries channels-last as
# timm's own form on a convnet
NO_FINDING_YET = {"float8-rowwise", "channels-last"}


def test_every_lever_declares_its_contract():
    assert len(REGISTRY) >= 12
    for lever in REGISTRY.values():
        assert lever.safety in (EXACT, CHANGES_NUMERICS)
        assert bool(lever.fixes) is (lever.id not in NO_FINDING_YET), lever.id
        assert all(code[:-3].isalpha() and code[-3:].isdigit() for code in lever.fixes)
        if lever.safety == CHANGES_NUMERICS and lever.choose_params is None:
            assert lever.tolerance is not None


def test_a_numerics_changing_lever_must_state_its_tolerance():
    with pytest.raises(ValueError, match="states its tolerance"):
        Lever("x", "x", CHANGES_NUMERICS, ("NORM001",), lambda t: None, lambda t: lambda: None)


# -- the public API -----------------------------------------------------------------------


def test_apply_rolls_back_when_a_later_lever_does_not_apply():
    workload = demo.build()
    before = state_of(workload.model)
    with pytest.raises(NotApplicable, match="fused-optimizer does not apply: it is already fused"):
        levers.apply(workload, ["inplace-scatter", "fused-optimizer"])
    assert not workload.model.fixes.clone
    assert_restored(workload.model, before)


def test_apply_can_skip_what_does_not_apply():
    workload = demo.build()
    with pytest.warns(UserWarning, match="fused-optimizer skipped"):
        handle = levers.apply(workload, "inplace-scatter,fused-optimizer", skip_inapplicable=True)
    assert handle.applied == ["inplace-scatter"]
    assert handle.skipped == {"fused-optimizer": "it is already fused"}


def test_apply_rejects_unknown_ids_and_non_models():
    with pytest.raises(ValueError, match="unknown lever"):
        levers.apply(torch.nn.Linear(2, 2), "no-such-lever")
    with pytest.raises(TypeError, match="nn.Module or a levers.Workload"):
        levers.apply("llama", "rms-norm-fused")


def test_step_levers_need_a_step_on_a_bare_model():
    with pytest.raises(NotApplicable, match="pass the step"):
        levers.apply(torch.nn.Linear(2, 2), "autocast-bf16")


# -- fused-optimizer ----------------------------------------------------------------------


def _mlp_workload(optimizer_class, **kwargs):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    optimizer = optimizer_class(model.parameters(), lr=1e-2, **kwargs)
    generator = torch.Generator().manual_seed(1)

    def step():
        x = torch.randn(4, 8, generator=generator)
        loss = model(x).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    return levers.Workload(model=model, step=step, optimizer=optimizer)


@pytest.mark.parametrize("optimizer_class", (torch.optim.AdamW, torch.optim.SGD))
def test_fused_optimizer_uses_foreach_on_cpu_within_tolerance(optimizer_class):
    off, on = _mlp_workload(optimizer_class, foreach=False), _mlp_workload(optimizer_class, foreach=False)
    off.step()  # state exists before the lever, as in a running job
    on.step()
    handle = levers.apply(on, "fused-optimizer")
    assert all(g["foreach"] and not g["fused"] for g in on.optimizer.param_groups)
    for _ in range(3):
        off.step(), on.step()
    tolerance = REGISTRY["fused-optimizer"].tolerance
    for p_off, p_on in zip(off.model.parameters(), on.model.parameters()):
        assert float((p_off - p_on).detach().norm() / p_off.detach().norm()) <= tolerance
    handle.undo()
    assert all(g["foreach"] is False and not g["fused"] for g in on.optimizer.param_groups)


def test_fused_optimizer_says_why_not():
    workload = _mlp_workload(torch.optim.RMSprop)
    with pytest.raises(NotApplicable, match="RMSprop has no fused implementation"):
        levers.apply(workload, "fused-optimizer")
    with pytest.raises(NotApplicable, match="already uses foreach"):
        levers.apply(_mlp_workload(torch.optim.Adam, foreach=True), "fused-optimizer")
    with pytest.raises(NotApplicable, match="no optimizer given"):
        levers.apply(torch.nn.Linear(2, 2), "fused-optimizer")


# -- autocast-bf16 ------------------------------------------------------------------------


def test_autocast_bf16_wraps_the_step_within_tolerance():
    on = llama.build()
    original = on.step
    handle = levers.apply(on, "autocast-bf16")
    assert on.step is handle.step is not original
    tolerance = REGISTRY["autocast-bf16"].tolerance
    on_trace, off_trace = run_steps(on, 1), run_steps(llama.build(), 1)
    assert_close(on_trace, off_trace, tolerance, grad_rtol=tolerance)
    handle.undo()
    assert on.step is original
    with pytest.raises(NotApplicable, match="already 16-bit"):
        levers.apply(llama.build(dtype="bfloat16"), "autocast-bf16")


# -- windowed-peak-metric -----------------------------------------------------------------


def test_windowed_peak_metric_resets_before_every_step(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda: calls.append("reset"))
    model = torch.nn.Linear(2, 2)
    handle = levers.apply(model, "windowed-peak-metric", step=lambda: calls.append("step"))
    handle.step()
    handle.step()
    assert calls == ["reset", "step", "reset", "step"]
    with pytest.raises(NotApplicable, match="already resets"):
        levers.apply(model, "windowed-peak-metric", step=handle.step)


# -- sdpa-cudnn-backend -------------------------------------------------------------------


def test_is_causal_mask_recognises_bool_and_additive_causal_masks():
    bool_mask = torch.ones(5, 5, dtype=torch.bool).tril()
    additive = torch.full((5, 5), float("-inf")).triu(1)
    assert is_causal_mask(bool_mask, 5, 5)
    assert is_causal_mask(additive[None, None], 5, 5)
    assert not is_causal_mask(additive, 4, 5)  # not square
    assert not is_causal_mask(torch.zeros(5, 5), 5, 5)  # full attention
    assert not is_causal_mask(torch.stack([additive, torch.zeros(5, 5)]), 5, 5)  # differs per batch


def test_admit_fused_turns_a_causal_mask_into_is_causal():
    q, k, v = (torch.randn(1, 2, 6, 8) for _ in range(3))
    mask = torch.full((6, 6), float("-inf")).triu(1)
    seen = []

    class Spy(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func is F.scaled_dot_product_attention:
                seen.append(dict(kwargs or {}))
            return func(*args, **(kwargs or {}))

    with Spy(), AdmitFused():
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert seen == [{"attn_mask": None, "is_causal": True}]
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert torch.allclose(out, expected, atol=1e-6)


# -- sdpa-attention on a timm-shaped model ------------------------------------------------


class TimmAttention(torch.nn.Module):
    """timm's Attention in miniature: ``fused_attn`` picks SDPA or the written-out chain."""

    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.heads, self.qkv, self.proj = heads, torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, dim)
        self.fused_attn = False

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        if self.fused_attn:
            x = F.scaled_dot_product_attention(q, k, v)
        else:
            attn = (q * q.shape[-1] ** -0.5) @ k.transpose(-2, -1)
            x = attn.softmax(dim=-1) @ v
        return self.proj(x.transpose(1, 2).reshape(b, n, c))


def test_sdpa_attention_flips_timm_fused_attn():
    torch.manual_seed(0)
    model = torch.nn.Sequential(TimmAttention(), TimmAttention())
    x = torch.randn(2, 5, 16)
    expected = model(x)
    with levers.apply(model, "sdpa-attention"):
        assert all(block.fused_attn for block in model)
        assert torch.allclose(model(x), expected, rtol=1e-5, atol=1e-6)
    assert not any(block.fused_attn for block in model)


# -- compile-blocks -----------------------------------------------------------------------


def test_compile_blocks_compiles_each_block_and_undoes():
    torch._dynamo.reset()
    on = llama.build()
    before = state_of(on.model)
    handle = levers.apply(on, "compile-blocks", backend="aot_eager")
    assert all(block._compiled_call_impl is not None for block in on.model.blocks)
    assert_close(run_steps(on), run_steps(llama.build()), REGISTRY["compile-blocks"].tolerance)
    handle.undo()
    assert all(block._compiled_call_impl is None for block in on.model.blocks)
    with pytest.raises(NotApplicable, match="no repeated blocks"):
        levers.apply(torch.nn.Linear(2, 2), "compile-blocks")
    before_keys = before[0].keys()
    assert on.model.state_dict().keys() == before_keys


# -- liger-kernels, with a stand-in for the package -----------------------------------------


def test_liger_kernels_says_why_not_here():
    from levers.workloads import hf

    with pytest.raises(NotApplicable, match="liger-kernel not installed"):
        levers.apply(hf.build(), "liger-kernels")


def test_liger_kernels_scopes_module_globals_to_the_model(monkeypatch):
    pytest.importorskip("transformers")
    from transformers.models.llama import modeling_llama

    from levers.levers import liger_kernels
    from levers.workloads import hf

    calls = []
    original_rope = modeling_llama.apply_rotary_pos_emb

    def fake_rope(q, k, cos, sin, *args, **kwargs):
        calls.append("rope")
        return original_rope(q, k, cos, sin, *args, **kwargs)

    def fake_apply(model=None, **options):
        # what Liger does: a module-global swap and instance patches
        modeling_llama.apply_rotary_pos_emb = fake_rope
        modeling_llama.LlamaRMSNorm = object
        for module in model.modules():
            if type(module).__name__ == "LlamaRMSNorm":
                module.offset = 0.0
                type(module).__name__ = "LigerRMSNorm"

    package = types.ModuleType("liger_kernel")
    package.__spec__ = importlib.machinery.ModuleSpec("liger_kernel", None)
    api = types.ModuleType("liger_kernel.transformers")
    patches = types.ModuleType("liger_kernel.transformers.monkey_patch")
    patches.MODEL_TYPE_TO_APPLY_LIGER_FN = {"llama": fake_apply}
    for name, module in (("liger_kernel", package), ("liger_kernel.transformers", api),
                         ("liger_kernel.transformers.monkey_patch", patches)):
        monkeypatch.setitem(sys.modules, name, module)

    patched, other = hf.build(), hf.build()
    before = state_of(patched.model)
    norm_class = modeling_llama.LlamaRMSNorm
    undo = liger_kernels.patch(Target(model=patched.model))
    # the process-wide changes are gone at once; the rope swap lives in this model's forward
    assert modeling_llama.apply_rotary_pos_emb is original_rope
    assert modeling_llama.LlamaRMSNorm is norm_class and norm_class.__name__ == "LlamaRMSNorm"
    other.step()
    assert calls == []
    undo()
    assert_restored(patched.model, before)
    undo = liger_kernels.patch(Target(model=patched.model))
    patched.step()
    assert calls and modeling_llama.apply_rotary_pos_emb is original_rope
    undo()
    assert "forward" not in vars(patched.model) and "offset" not in vars(patched.model.model.norm)


# -- raise-batch --------------------------------------------------------------------------


def test_raise_batch_picks_the_largest_predicted_fit_and_says_so():
    from levers.levers.raise_batch import fit_batch

    lever = REGISTRY["raise-batch"]
    params, said = fit_batch("llama", {"size": "tiny"}, {"gpu": "2GiB", "max_batch_size": 64})
    assert params["batch_size"] == 64  # the tiny llama fits 2 GiB far beyond the cap
    assert said.startswith("raise-batch: batch_size 2 -> 64")
    assert "at least 64 (the search stopped at its cap, 64)" in said
    with pytest.raises(ValueError, match="there is none here"):
        lever.choose_params("llama", {"size": "tiny"}, {})
    with pytest.raises(NotApplicable, match="factory parameters"):
        levers.apply(llama.build(), "raise-batch")


def test_raise_batch_leaves_room_for_the_step_beside_it_and_says_so():
    # levers ab holds its baseline on the GPU while the candidate steps: the candidate's batch
    # is fitted to what the baseline leaves (on the H200 the audit's A/B of batch 27 beside the
    # hf llama 1b's batch 4 ran out of memory)
    from levers.hardware import resolve_gpu
    from levers.levers.raise_batch import _held_beside, fit_batch

    beside = ("llama", {"size": "tiny", "batch_size": 32})
    held = _held_beside(beside, resolve_gpu("512MiB"))
    assert held > 0
    options = {"gpu": "512MiB", "max_batch_size": 4096}
    alone, _ = fit_batch("llama", {"size": "tiny"}, options)
    shared, said = fit_batch("llama", {"size": "tiny"}, {**options, "beside": beside})
    assert shared["batch_size"] < alone["batch_size"]
    assert f"predicted to reserve {held / 2**30:.1f} GiB" in said
    assert "smaller than the step alone would fit" in said
    # a baseline that cannot be predicted: refused with the cause and what to do instead
    with pytest.raises(ValueError, match="could not be predicted.*--set-b batch_size=N"):
        fit_batch("llama", {"size": "tiny"}, {**options, "beside": ("llama", {"size": "huge"})})


def test_ab_names_its_baseline_to_the_levers_that_choose_the_candidates_parameters(monkeypatch):
    from types import SimpleNamespace

    from levers.ab import design as design_mod
    from levers.ab.lever_lookup import choose_params

    seen = {}

    def choose(spec, params, options):
        seen.update(options)
        return {**params, "batch_size": 8}, "chose 8"

    lever = SimpleNamespace(id="fake-batch", choose_params=choose, options={})
    beside = ("llama", {"size": "tiny", "batch_size": 2})
    assert choose_params("llama", {"size": "tiny"}, [lever], beside=beside)["batch_size"] == 8
    assert seen["beside"] == beside and seen["levers"] == []
    # and ab's design passes its baseline side
    calls = []
    monkeypatch.setattr(
        design_mod, "choose_params", lambda *args, **kwargs: calls.append(kwargs) or args[1]
    )
    given = {"baseline": "llama", "params": {"size": "tiny"}, "levers": ["compile-blocks"]}
    resolved, _ = design_mod.resolve(given, {}, None)
    design_mod.sides(resolved)
    [kwargs] = calls
    spec, params = kwargs["beside"]
    assert spec == "llama" and params["size"] == "tiny"


def test_raise_batch_predicts_the_step_with_its_blocks_compiled(monkeypatch):
    # issue 21: the fit is of the step that will run, blocks compiled, not of the eager step
    from levers.levers.raise_batch import fit_batch
    from levers.memory.prediction import NOT_PREDICTED
    from levers.memory import compiled

    graphs = []
    original = compiled.backend

    def counting(gm, example_inputs, **kwargs):
        graphs.append(gm)
        return original(gm, example_inputs, **kwargs)

    monkeypatch.setattr(compiled, "backend", counting)
    assert "compile-blocks" not in NOT_PREDICTED
    options = {"gpu": "2GiB", "max_batch_size": 4, "levers": ["compile-blocks"]}
    params, said = fit_batch("llama", {"size": "tiny"}, options)
    assert params["batch_size"] == 4
    assert "with compile-blocks" in said
    # the predicted steps ran compiled (eager ones would call no backend)
    assert graphs


def test_raise_batch_predicts_the_fused_loss_with_the_kernel_that_will_run(monkeypatch):
    # where Liger Kernel is installed the run's fused loss is Liger's: the fit predicts its
    # allocations (the stand-in), not the chunked loss's
    import importlib.util

    from levers.levers import _lce
    from levers.levers.raise_batch import fit_batch

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        _lce.importlib.util, "find_spec",
        lambda name, *a: object() if name == "liger_kernel" else real_find_spec(name, *a),
    )
    kernels = []
    original = _lce.available_kernel

    def spying(device, requested="auto"):
        kernels.append(original(device, requested))
        return kernels[-1]

    monkeypatch.setattr(_lce, "available_kernel", spying)
    options = {"gpu": "2GiB", "max_batch_size": 2, "levers": ["fused-linear-cross-entropy"]}
    params, said = fit_batch("hf", {"arch": "llama", "size": "tiny"}, options)
    assert "with fused-linear-cross-entropy" in said
    assert kernels and set(kernels) == {"liger"}
    # a lever that does not apply to the predicted step is named as left out, not as predicted
    params, said = fit_batch("llama", {"size": "tiny"}, options)
    assert "with fused-linear-cross-entropy" not in said
    assert "not in the prediction: fused-linear-cross-entropy (no recognised LM head" in said


def test_raise_batch_fits_the_step_that_holds_the_optimizers_state(monkeypatch):
    # the optimizer's state is made in the first step's optimizer.step, after that step's peak:
    # a one-step prediction leaves it out (8.2 GiB on the llama 1b's AdamW), so the fit predicts
    # as many steps as levers memory does
    from levers.hardware import resolve_gpu
    from levers.levers.raise_batch import fit_batch
    from levers.memory import fit
    from levers.memory.predict import run_prediction, source_of
    from levers.memory.steps import DEFAULT_NUM_STEPS

    source = source_of("hf", {"arch": "llama", "size": "tiny", "batch_size": 2})
    one, later = (
        run_prediction(source, resolve_gpu("h200"), num_steps=n).replay.peak_allocated_bytes
        for n in (1, DEFAULT_NUM_STEPS)
    )
    assert later > one
    steps = []
    original = fit.fit_param

    def spying(source, options, *args, **kwargs):
        steps.append(options.num_steps)
        return original(source, options, *args, **kwargs)

    monkeypatch.setattr(fit, "fit_param", spying)
    fit_batch("hf", {"arch": "llama", "size": "tiny"}, {"gpu": "2GiB", "max_batch_size": 2})
    assert steps == [DEFAULT_NUM_STEPS]


def test_raise_batch_never_runs_a_gpu_batch_on_the_host():
    # a batch fitted to a GPU's memory, run on the CPU, is killed by the kernel: refused first
    lever = REGISTRY["raise-batch"]
    with pytest.raises(ValueError, match="would run here, on the CPU") as caught:
        lever.choose_params("llama", {"size": "tiny", "device": "cpu"}, {"gpu": "h100"})
    assert "levers memory llama --gpu h100 --fit batch_size" in str(caught.value)


def _factory_batch(device="cpu", batch=4, seq_len=8):
    raise AssertionError("not built")


def _factory_hf(per_device_train_batch_size=8, lr=1e-3):
    raise AssertionError("not built")


def _factory_none(width=8, depth=2):
    raise AssertionError("not built")


def test_raise_batch_finds_the_batch_parameter_as_factories_name_it():
    from levers.levers.raise_batch import batch_param

    assert batch_param("llama", {}) == "batch_size"
    assert batch_param(_factory_batch, {}) == "batch"
    assert batch_param(_factory_hf, {}) == "per_device_train_batch_size"
    assert batch_param(_factory_batch, {"param": "seq_len"}) == "seq_len"
    with pytest.raises(ValueError, match=r"its parameters: width, depth\); name it with raise-batch:param=NAME"):
        batch_param(_factory_none, {})
    with pytest.raises(ValueError, match="takes no parameter 'rows'"):
        batch_param(_factory_none, {"param": "rows"})
