"""The ``demo`` workload: steps, determinism, the ``fixed`` flags, and what each fix changes."""

from __future__ import annotations

import collections
import math
from pathlib import Path

import pytest
import torch
from torch.nn.attention import SDPBackend
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from levers.workloads import demo, demo_text
from levers.workloads.demo_config import FLAGS, SIZES, DemoFixes, parse_fixed
from levers.workloads.demo_data import IGNORE_INDEX, make_layout, sample_batch
from levers.workloads.demo_model import DemoVLM
from levers.workloads.demo_sites import inefficiency_sites
from levers.workloads.demo_text import TextLayer
from levers.workloads.demo_vision import VisionBlock

TINY = SIZES["tiny"]
EXACT_FIXES = ("suffix_attn", "checkpointing", "syncs", "clone", "peak_metric")
NUMERIC_FIXES = ("vit_attn", "norm", "loss")


def tiny_batch(seed: int = 0):
    layout = make_layout(TINY, seed, torch.device("cpu"))
    return sample_batch(TINY, layout, torch.Generator().manual_seed(seed), torch.float32)


def loss_and_grads(fixed) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One forward and backward of a freshly built tiny demo on a fixed batch."""
    model = demo.build(fixed=fixed).model
    loss = model(tiny_batch())
    loss.backward()
    return loss.detach(), {name: p.grad for name, p in model.named_parameters()}


class FunctionCounter(TorchFunctionMode):
    """Counts torch-level calls (torch.einsum, F.rms_norm, Tensor.clone, ...) by name."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: collections.Counter[str] = collections.Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.counts[getattr(func, "__name__", str(func))] += 1
        return func(*args, **(kwargs or {}))


class SyncCounter(TorchDispatchMode):
    """Counts the aten calls that make a GPU wait: scalar reads and boolean-mask indexing."""

    def __init__(self) -> None:
        super().__init__()
        self.scalar_reads = 0
        self.boolean_indexing = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name == "_local_scalar_dense":
            self.scalar_reads += 1
        if name in ("index", "index_put", "index_put_") and any(
            isinstance(index, torch.Tensor) and index.dtype == torch.bool
            for index in args[1]
            if index is not None
        ):
            self.boolean_indexing += 1
        if name == "nonzero":
            self.boolean_indexing += 1
        return func(*args, **(kwargs or {}))


def forward_backward_counts(fixed):
    model = demo.build(fixed=fixed).model
    functions, syncs = FunctionCounter(), SyncCounter()
    with syncs, functions:
        model(tiny_batch()).backward()
    return functions.counts, syncs


# --- building and stepping ------------------------------------------------------------------


def test_tiny_runs_two_steps_with_finite_changing_loss():
    workload = demo.build()
    first, second = workload.step(), workload.step()
    assert math.isfinite(first.item()) and math.isfinite(second.item())
    assert first.item() != second.item()
    assert not first.requires_grad
    # A random init over a 512-token vocabulary starts near ln(512) = 6.24.
    assert 5.0 < first.item() < 7.5


def test_workload_metadata():
    workload = demo.build()
    assert workload.name == "demo-tiny"
    assert workload.device == torch.device("cpu")
    assert workload.tokens_per_step == 2 * (16 + 16 + 8)
    assert workload.params == {
        "size": "tiny",
        "device": "cpu",
        "dtype": "float32",
        "seed": 0,
        "batch_size": 2,
        "fixed": (),
    }
    assert workload.optimizer is not None
    assert {id(p) for group in workload.optimizer.param_groups for p in group["params"]} == {
        id(p) for p in workload.model.parameters()
    }


def test_batch_size_changes_tokens_per_step():
    workload = demo.build(batch_size=3)
    assert workload.tokens_per_step == 3 * 40
    assert workload.params["batch_size"] == 3
    assert workload.step().shape == ()


def test_bfloat16_parameters():
    workload = demo.build(dtype="bfloat16")
    assert {p.dtype for p in workload.model.parameters()} == {torch.bfloat16}
    assert workload.params["dtype"] == "bfloat16"
    assert math.isfinite(workload.step().item())
    assert torch.get_default_dtype() == torch.float32


def test_step_records_peak_metric():
    workload = demo.build()
    workload.step()
    # No CUDA here: the allocator reports 0 and the read must not raise.
    assert workload.model.metrics == {"peak_allocated_bytes": 0}


# --- determinism ----------------------------------------------------------------------------


def test_same_seed_gives_bitwise_equal_losses():
    first, second = demo.build(seed=3), demo.build(seed=3)
    for _ in range(2):
        assert torch.equal(first.step(), second.step())


def test_different_seed_gives_different_losses():
    assert not torch.equal(demo.build(seed=0).step(), demo.build(seed=1).step())


# --- the data -------------------------------------------------------------------------------


def test_targets_are_half_padding():
    batch = tiny_batch()
    is_padding = batch.targets_bt == IGNORE_INDEX
    assert is_padding.sum().item() == TINY.batch_size * TINY.suffix_len // 2
    assert batch.layout.num_targets == 8
    assert torch.equal(batch.layout.target_rows, torch.nonzero(~is_padding.flatten()).flatten())
    # The answer text block (2 tokens) is always real; padding falls in the action block.
    assert batch.layout.text_target_rows.tolist() == [0, 1, 8, 9]


def test_suffix_inputs_are_targets_shifted_right():
    batch = tiny_batch()
    real = batch.targets_bt != IGNORE_INDEX
    shifted = batch.suffix_ids_bt[:, 1:]
    assert torch.equal(shifted[real[:, :-1]], batch.targets_bt[:, :-1][real[:, :-1]])
    assert (batch.suffix_ids_bt[:, TINY.suffix_text_tokens + 1 :] >= TINY.base_vocab).all()


# --- the fixed parameter --------------------------------------------------------------------


def test_parse_fixed_none_and_all():
    assert parse_fixed("none") == DemoFixes()
    assert parse_fixed("all").names() == FLAGS


def test_parse_fixed_list_forms_give_flags_in_canonical_order():
    assert parse_fixed("clone, syncs").names() == ("syncs", "clone")
    assert parse_fixed(["peak_metric", "norm"]).names() == ("norm", "peak_metric")
    assert parse_fixed(("loss",)).names() == ("loss",)
    assert demo.build(fixed="clone,norm").params["fixed"] == ("norm", "clone")


@pytest.mark.parametrize("value", ["clone,cloen", ["all"], "fast"])
def test_parse_fixed_rejects_unknown_flags_and_lists_valid_ones(value):
    with pytest.raises(ValueError, match="valid flags are: suffix_attn, vit_attn, norm") as info:
        parse_fixed(value)
    assert "peak_metric" in str(info.value)


def test_parse_fixed_rejects_other_types():
    with pytest.raises(ValueError, match="comma-separated list of: suffix_attn"):
        parse_fixed(3)


# --- fixes: exact ones are bitwise, numeric ones are close ----------------------------------


@pytest.mark.parametrize("fixed", [*EXACT_FIXES, ",".join(EXACT_FIXES)])
def test_exact_fix_gives_bitwise_equal_loss_and_gradients(fixed):
    base_loss, base_grads = loss_and_grads("none")
    loss, grads = loss_and_grads(fixed)
    assert torch.equal(loss, base_loss)
    assert grads.keys() == base_grads.keys()
    for name, grad in grads.items():
        assert torch.equal(grad, base_grads[name]), name


@pytest.mark.parametrize("fixed", [*EXACT_FIXES, ",".join(EXACT_FIXES)])
def test_exact_fix_gives_bitwise_equal_training_steps(fixed):
    base, candidate = demo.build(), demo.build(fixed=fixed)
    for _ in range(2):
        assert torch.equal(candidate.step(), base.step())


@pytest.mark.parametrize("fixed", [*NUMERIC_FIXES, "all"])
def test_numeric_fix_gives_close_loss_and_gradients(fixed):
    base_loss, base_grads = loss_and_grads("none")
    loss, grads = loss_and_grads(fixed)
    torch.testing.assert_close(loss, base_loss, rtol=1e-5, atol=1e-6)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, base_grads[name], rtol=1e-4, atol=1e-6, msg=name)


# --- fixes: each one changes the code path it names -----------------------------------------


def test_vit_attn_fix_replaces_einsum_attention_with_sdpa():
    broken, _ = forward_backward_counts("none")
    fixed, _ = forward_backward_counts("vit_attn")
    assert broken["einsum"] == 2 * TINY.vit_blocks
    assert fixed["einsum"] == 0
    assert (
        fixed["scaled_dot_product_attention"]
        == broken["scaled_dot_product_attention"] + TINY.vit_blocks
    )


def test_norm_fix_uses_fused_rms_norm_everywhere_in_the_text_decoder():
    broken, _ = forward_backward_counts("none")
    fixed, _ = forward_backward_counts("norm")
    # prefix: 2 norms in each full layer + 1 in the last layer (keys and values only);
    # suffix: 2 norms per layer + the final norm.
    num_norms = 2 * (TINY.text_layers - 1) + 1 + 2 * TINY.text_layers + 1
    assert broken["rms_norm"] == 0 and broken["rsqrt"] == num_norms
    assert fixed["rms_norm"] == num_norms and fixed["rsqrt"] == 0


def test_loss_fix_drops_the_logit_cat_and_the_all_rows_upcast():
    broken, _ = forward_backward_counts("none")
    fixed, _ = forward_backward_counts("loss")
    assert broken["cross_entropy"] == 1 and fixed["cross_entropy"] == 2
    assert fixed["cat"] == broken["cat"] - 1
    assert fixed["index_select"] == broken["index_select"] + 4


def test_loss_fix_upcasts_only_real_rows():
    upcast_rows = []

    class FloatRows(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            result = func(*args, **(kwargs or {}))
            if getattr(func, "__name__", "") == "float" and result.shape[-1] == TINY.vocab_size:
                upcast_rows.append(result.shape[0])
            return result

    for fixed in ("none", "loss"):
        model = demo.build(fixed=fixed).model
        with FloatRows():
            model(tiny_batch())
    all_rows = TINY.batch_size * TINY.suffix_len
    assert upcast_rows == [all_rows, 4, 4]


def test_syncs_fix_removes_every_sync_from_forward_and_backward():
    _, broken = forward_backward_counts("none")
    _, fixed = forward_backward_counts("syncs")
    # int(is_patch.sum()) once, bool(is_extension.any()) for prefix and suffix.
    assert broken.scalar_reads == 3
    # The boolean-mask loss index, forward and backward.
    assert broken.boolean_indexing == 2
    assert (fixed.scalar_reads, fixed.boolean_indexing) == (0, 0)


def test_all_fixes_leave_no_sync():
    _, syncs = forward_backward_counts("all")
    assert (syncs.scalar_reads, syncs.boolean_indexing) == (0, 0)


def test_clone_fix_removes_the_prefix_clone():
    broken, _ = forward_backward_counts("none")
    fixed, _ = forward_backward_counts("clone")
    assert broken["clone"] == 1
    assert fixed["clone"] == 0


@pytest.mark.parametrize(("fixed", "runs_per_block"), [("none", 1), ("checkpointing", 2)])
def test_checkpointing_fix_recomputes_prefix_blocks_in_backward(monkeypatch, fixed, runs_per_block):
    runs = collections.Counter()
    for block_class in (VisionBlock, TextLayer):

        def counted_forward(self, *args, _forward=block_class.forward):
            runs[id(self)] += 1
            return _forward(self, *args)

        monkeypatch.setattr(block_class, "forward", counted_forward)
    model = demo.build(fixed=fixed).model
    model(tiny_batch()).backward()
    # TextLayer.forward is the prefix pass; the last layer only gives its keys and values.
    blocks = [*model.vision.blocks, *model.text.layers[:-1]]
    assert [runs[id(block)] for block in blocks] == [runs_per_block] * len(blocks)
    assert runs[id(model.text.layers[-1])] == 0


def test_checkpointing_fix_saves_fewer_activations():
    def num_saved(fixed):
        model = demo.build(fixed=fixed).model
        count = 0

        def pack(tensor):
            nonlocal count
            count += 1
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            model(tiny_batch())
        return count

    assert num_saved("checkpointing") < num_saved("none")


@pytest.mark.parametrize(
    ("fixed", "expected"),
    [
        ("none", [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]),
        (
            "suffix_attn",
            [
                SDPBackend.CUDNN_ATTENTION,
                SDPBackend.FLASH_ATTENTION,
                SDPBackend.EFFICIENT_ATTENTION,
                SDPBackend.MATH,
            ],
        ),
    ],
)
def test_suffix_attention_backend_pin(monkeypatch, fixed, expected):
    pins = []
    real_sdpa_kernel = demo_text.sdpa_kernel

    def recording_sdpa_kernel(backends):
        pins.append(list(backends))
        return real_sdpa_kernel(backends)

    monkeypatch.setattr(demo_text, "sdpa_kernel", recording_sdpa_kernel)
    demo.build(fixed=fixed).model(tiny_batch())
    assert pins == [expected] * TINY.text_layers


@pytest.mark.parametrize(("fixed", "resets_per_step"), [("none", 0), ("peak_metric", 1)])
def test_peak_metric_resets_the_window_only_when_fixed(monkeypatch, fixed, resets_per_step):
    workload = demo.build(fixed=fixed)
    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda *a: calls.append("reset"))

    def max_memory_allocated(*args):
        calls.append("read")
        return 123

    monkeypatch.setattr(torch.cuda, "max_memory_allocated", max_memory_allocated)
    workload.step()
    workload.step()
    assert calls == (["reset"] * resets_per_step + ["read"]) * 2
    assert workload.model.metrics == {"peak_allocated_bytes": 123}


# --- the source sites a detector points at --------------------------------------------------


def test_every_flag_has_marked_source_sites():
    expected = {
        "suffix_attn": ["scaled_dot_product_attention("],
        "vit_attn": ['torch.einsum("bhqe,bhke->bhqk"'],
        "norm": [".rsqrt()"],
        "checkpointing": ["block(x_bpw, valid_bp)", "layer(x_bsd, cos, sin)"],
        "loss": ["torch.cat([logits_text, logits_action], dim=1)"],
        "syncs": ["int(is_patch.sum())", "bool(is_extension.any())", "[targets != IGNORE_INDEX]"],
        "clone": [".clone()"],
        "peak_metric": ["torch.cuda.max_memory_allocated()"],
    }
    sites = inefficiency_sites()
    assert tuple(sites) == FLAGS
    for flag, snippets in expected.items():
        texts = [Path(site.path).read_text().splitlines()[site.line - 1] for site in sites[flag]]
        assert len(texts) == len(snippets), flag
        for snippet in snippets:
            assert sum(snippet in text for text in texts) == 1, (flag, snippet, texts)


def test_site_functions_name_the_enclosing_code():
    sites = inefficiency_sites()
    assert [site.function for site in sites["suffix_attn"]] == ["suffix_attention"]
    assert [site.function for site in sites["clone"]] == ["DemoVLM.embed_prefix"]
    assert [site.function for site in sites["peak_metric"]] == ["training_step.step"]


# --- sizes ----------------------------------------------------------------------------------


def test_1b_has_about_a_billion_parameters():
    with torch.device("meta"):
        model = DemoVLM(SIZES["1b"], DemoFixes())
    num_params = sum(p.numel() for p in model.parameters())
    assert 0.9e9 < num_params < 1.3e9
    assert SIZES["1b"].prefix_len == 1100 and SIZES["1b"].suffix_len == 60


def test_1b_steps_under_fake_tensors():
    # Checks the 1b shapes fit together without a GPU. The unfixed syncs read device values,
    # which a fake tensor does not have, so they are fixed here.
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        workload = demo.build(size="1b", fixed="syncs")
        loss = workload.step()
    assert loss.shape == ()
    assert workload.tokens_per_step == 8 * 1160
