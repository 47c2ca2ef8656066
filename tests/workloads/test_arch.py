"""The ``arch`` workload: architectures of transformers' auto mappings and timm's registry,
built from their defaults with the shape fields set."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from levers.errors import LeversError  # noqa: E402
from levers.loader import load_workload  # noqa: E402
from levers.workloads import arch  # noqa: E402
from levers.workloads.arch import transformers_models  # noqa: E402
from levers.workloads.arch.transformers_models import config_fields, keep_kinds  # noqa: E402

# (model, task) -> (the model class, its width, depth) at size tiny
TINY = {
    ("opt", "causal-lm"): ("OPTForCausalLM", 64, 2),
    ("bloom", "causal-lm"): ("BloomForCausalLM", 64, 2),
    ("deberta-v2", "masked-lm"): ("DebertaV2ForMaskedLM", 64, 2),
    ("bart", "seq2seq"): ("BartForConditionalGeneration", 64, 2),
    ("deit", "image-classification"): ("DeiTForImageClassification", 64, 2),
}


@pytest.mark.parametrize(("model", "task"), sorted(TINY))
def test_tiny_builds_from_the_defaults_with_the_shapes_set_and_trains(model, task):
    workload = arch.build(model=model, task=task)
    class_name, width, depth = TINY[(model, task)]
    config = workload.model.config
    assert type(workload.model).__name__ == class_name
    assert (config.hidden_size, config.num_hidden_layers) == (width, depth)
    assert workload.params == {"model": model, "task": task, "size": "tiny", "device": "cpu",
                               "dtype": "float32", "seed": 0, "batch_size": 2,
                               "layers": depth}
    assert workload.name == f"arch-{model}-{task}-tiny"
    before = {n: p.detach().clone() for n, p in workload.model.named_parameters()}
    loss = workload.step()
    assert torch.isfinite(loss) and loss.ndim == 0
    assert any(not torch.equal(before[n], p) for n, p in workload.model.named_parameters())


def test_every_other_config_field_keeps_its_shipped_default():
    from transformers import OPTConfig

    config = arch.build(model="opt").model.config
    shipped = OPTConfig()
    assert (config.dropout, config.activation_function, config.use_cache,
            config.do_layer_norm_before) == (shipped.dropout, shipped.activation_function,
                                             shipped.use_cache, shipped.do_layer_norm_before)
    # the feed-forward keeps its shipped 4x of the width; positions cover the sequence
    assert config.ffn_dim == 4 * config.hidden_size
    assert config.max_position_embeddings == shipped.max_position_embeddings


def test_the_batches_follow_the_task():
    def batch(model, task):
        workload = arch.build(model=model, task=task, batch_size=3)
        entry = arch.entry(model, task)
        shape = {**entry.sizes["tiny"], "batch_size": 3, "param_dtype": torch.float32}
        return workload, entry.make_batch(shape, torch.Generator().manual_seed(0))

    workload, causal = batch("opt", "causal-lm")
    assert causal["input_ids"].shape == (3, 32) and torch.equal(causal["labels"],
                                                                causal["input_ids"])
    assert workload.tokens_per_step == 3 * 32
    _, masked = batch("deberta-v2", "masked-lm")
    targets = masked["labels"] != -100
    assert targets[:, 0].all() and 0 < targets.float().mean() < 0.5
    workload, seq2seq = batch("bart", "seq2seq")
    assert seq2seq["decoder_input_ids"].shape == seq2seq["labels"].shape == (3, 16)
    assert workload.tokens_per_step == 3 * (32 + 16)
    workload, images = batch("deit", "image-classification")
    assert images["pixel_values"].shape == (3, 3, 64, 64) and images["labels"].max() < 10
    assert workload.tokens_per_step == 3 * (64 // 16) ** 2  # patch tokens
    workload, _ = batch("resnet", "image-classification")
    assert workload.tokens_per_step == 3  # images


def test_the_shape_rules_keep_the_shipped_ratios():
    tiny = arch.entry("llama", "causal-lm").sizes["tiny"]
    # llama's key-value heads (None: one per head) and its head dim are derived, not set
    llama = config_fields("llama", "causal-lm", tiny)
    assert llama["hidden_size"] == 64 and llama["num_attention_heads"] == 4
    assert llama["intermediate_size"] == 176  # 11008 / 4096 of the width, to a multiple of 8
    # mistral ships 32 heads over 8 key-value heads; gemma an explicit head dim (256)
    assert config_fields("mistral", "causal-lm", tiny)["num_key_value_heads"] == 1
    assert config_fields("gemma", "causal-lm", tiny)["head_dim"] == 16
    # codegen's rotary part of the head keeps its share (64 of 256)
    assert config_fields("codegen", "causal-lm", tiny)["rotary_dim"] == 4
    # gpt2's shipped token ids lie outside a 512-token vocabulary
    assert config_fields("gpt2", "causal-lm", tiny)["eos_token_id"] == 511
    # an encoder's causal LM head needs is_decoder
    assert config_fields("bert", "causal-lm", tiny)["is_decoder"] is True
    assert "is_decoder" not in config_fields("bert", "masked-lm", tiny)


def test_a_mixture_of_experts_keeps_few_experts_and_one_layer_of_each_kind():
    tiny = arch.entry("deepseek_v3", "causal-lm").sizes["tiny"]
    fields = config_fields("deepseek_v3", "causal-lm", tiny)
    assert fields["n_routed_experts"] == 4 and fields["num_experts_per_tok"] == 2
    assert fields["n_group"] == fields["topk_group"] == 1
    assert fields["first_k_dense_replace"] == 1  # one dense layer, then a sparse one
    assert arch.entry("deepseek_v3", "causal-lm").family == "moe"


def test_per_layer_lists_keep_one_layer_of_each_kind():
    assert keep_kinds(["dense"] * 3 + ["sparse"] * 58, 2) == ["dense", "sparse"]
    pattern = ["sliding"] * 5 + ["full"]
    assert keep_kinds(pattern * 4, 2) == ["sliding", "full"]
    assert keep_kinds(pattern, 4) == ["sliding", "sliding", "sliding", "full"]
    assert keep_kinds(["a", "b"], 5) == ["a", "b", "a", "b", "a"]
    fields = config_fields("gemma2", "causal-lm", arch.entry("gemma2", "causal-lm").sizes["tiny"])
    assert sorted(fields["layer_types"]) == ["full_attention", "sliding_attention"]


def test_full_is_a_realistic_shape_built_on_the_meta_device():
    entry = arch.entry("opt", "causal-lm")
    full = {**entry.sizes["full"], "param_dtype": torch.float32}
    assert (full["width"], full["layers"], full["seq_len"], full["batch_size"]) == (2048, 8,
                                                                                   2048, 8)
    with torch.device("meta"):
        model = entry.make_model(full)
    assert model.config.vocab_size == 50272  # the shipped vocabulary
    assert 0.4e9 < sum(p.numel() for p in model.parameters()) < 0.6e9
    assert entry.tokens_per_step(full) == 8 * 2048
    deit = arch.entry("deit", "image-classification").sizes["full"]
    assert (deit["image_size"], deit["layers"], deit["batch_size"]) == (224, 12, 64)


def test_layers_and_batch_size_override_the_size():
    workload = arch.build(model="gpt_neox", layers=3, batch_size=1)
    assert workload.model.config.num_hidden_layers == 3
    assert workload.params["layers"] == 3 and workload.tokens_per_step == 32
    stages = arch.build(model="convnext", layers=2).model.config
    assert stages.depths == [2, 2, 6, 2]  # the shallowest stage at 2, the others keep their share


def test_the_loader_builds_it_from_its_recorded_parameters():
    workload = load_workload("arch", {"model": "bloom"})
    assert workload.params["task"] == "causal-lm"
    again = load_workload("arch", {k: str(v) for k, v in workload.params.items()})
    assert again.params == workload.params
    assert torch.equal(workload.step(), again.step())


def test_it_says_what_to_do_for_what_it_cannot_build():
    with pytest.raises(ValueError, match="not a model type of transformers' auto mappings.*"
                       "arch_sweep.py --list"):
        arch.build(model="gpt5")
    with pytest.raises(ValueError, match="several auto mappings; pass task= one of: causal-lm, "
                       "masked-lm, seq2seq"):
        arch.build(model="bart")
    with pytest.raises(ValueError, match="has no seq2seq class in transformers; its tasks: "
                       "causal-lm"):
        arch.build(model="opt", task="seq2seq")
    with pytest.raises(ValueError, match="task='vision'"):
        arch.build(model="opt", task="vision")
    # the sweeps' name of an architecture with its task, as their results write it
    with pytest.raises(ValueError, match="names a task: write it as model=xlm task=masked-lm"):
        arch.build(model="xlm/masked-lm")


def test_a_vision_language_model_is_built_with_each_nested_config_shrunk_and_trains_on_text():
    # Gemma 3's config nests a text and a vision config; its causal LM class is the whole model
    workload = arch.build(model="gemma3")
    config = workload.model.config
    assert type(workload.model).__name__ == "Gemma3ForConditionalGeneration"
    assert (config.text_config.hidden_size, config.text_config.num_hidden_layers) == (64, 2)
    assert (config.vision_config.hidden_size, config.vision_config.num_hidden_layers) == (64, 2)
    assert config.text_config.vocab_size == 512
    # its image token sits inside the vocabulary: a text-only batch draws ids below it
    assert config.image_token_id < 512
    shape = transformers_models.entry("gemma3", "causal-lm").sizes["tiny"]
    assert shape["ids_below"] == min(config.image_token_id, config.boi_token_index)
    from levers.workloads.zoo.spec import causal_lm_batch

    drawn = causal_lm_batch({**shape, "seq_len": 4096}, torch.Generator().manual_seed(0))
    assert int(drawn["input_ids"].max()) == shape["ids_below"] - 1
    before = {n: p.detach().clone() for n, p in workload.model.named_parameters()}
    assert torch.isfinite(workload.step())
    moved = {n for n, p in workload.model.named_parameters() if not torch.equal(before[n], p)}
    assert any("language_model" in n for n in moved)


@pytest.mark.parametrize(("model", "positions"), [("ibert", 514), ("roberta", 514),
                                                   ("xlm-roberta", 514), ("bert", 512)])
def test_at_full_a_model_that_numbers_positions_from_its_padding_index_gets_room_for_them(
        model, positions):
    # the RoBERTa family numbers n tokens' positions from pad_token_id + 1 on: at 512 tokens its
    # default configs' 512 positions ran a gather out of range (a device-side assert on an H100)
    entry = arch.entry(model, "masked-lm")
    full = entry.sizes["full"]
    assert full["seq_len"] == 512
    fields = config_fields(model, "masked-lm", full, "full")
    assert fields.get("max_position_embeddings", 512) == positions
    assert config_fields(model, "masked-lm", {**full, "seq_len": 64}, "full").get(
        "max_position_embeddings", 512) == 512


def test_a_model_whose_towers_need_their_inputs_says_so_through_the_capture():
    # GIT's captioner reads its image features: a text-only batch cannot train it
    from levers.capture.step import run_step_or_error
    from levers.errors import StepError

    workload = arch.build(model="git")
    with pytest.raises(StepError, match="arch gives git text-only batches, and its config nests "
                       "vision_config: its step raised ValueError") as raised:
        run_step_or_error(workload)
    assert "report it as a bug" not in str(raised.value)
    assert "build its text model by its own model type" in str(raised.value)


def test_a_model_with_towers_whose_step_runs_out_of_memory_says_so_not_that_it_needs_towers():
    # gemma3 at its full shape on an H100: the OOM was read as a missing tower input
    entry = arch.entry("git", "causal-lm")

    class Huge(torch.nn.Module):
        def forward(self, **inputs):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 16.00 GiB.")

    class Refuses(torch.nn.Module):
        def forward(self, **inputs):
            raise ValueError("pixel_values are required")

    batch = {"input_ids": torch.zeros(1, 4, dtype=torch.long)}
    with pytest.raises(LeversError, match="its config nests vision_config"):
        entry.loss(Refuses(), batch)  # a refusal of the batch is still read as the towers'
    with pytest.raises(torch.OutOfMemoryError, match="Tried to allocate 16.00 GiB"):
        entry.loss(Huge(), batch)


def test_an_image_classifier_whose_config_nests_its_tower_is_built_from_the_tower():
    workload = arch.build(model="clip")
    assert type(workload.model).__name__ == "CLIPForImageClassification"
    assert workload.model.config.vision_config.hidden_size == 64
    assert workload.params["task"] == "image-classification"
    assert torch.isfinite(workload.step())


def test_a_config_that_nests_configs_without_defaults_is_refused_with_the_reason(monkeypatch):
    class Parts:
        sub_configs = {"encoder": object, "decoder": object}

        def __init__(self):
            raise ValueError("pass an encoder and a decoder")

    with pytest.raises(LeversError, match=r"Parts nests other configs \(decoder, encoder\) "
                       "and has no defaults for them \(ValueError: pass an encoder"):
        transformers_models.nested(Parts)


def test_architectures_lists_each_model_type_per_task():
    rows = arch.architectures()
    assert ("opt", "causal-lm") in rows and ("bart", "seq2seq") in rows
    assert ("deberta-v2", "masked-lm") in rows and ("deit", "image-classification") in rows
    assert transformers_models.tasks_of("bart") == ("causal-lm", "masked-lm", "seq2seq")
    assert len(rows) > 250


def test_a_timm_model_is_shrunk_where_timm_takes_a_depth_and_an_image_size():
    workload = arch.build(model="timm:vit_tiny_patch16_224")
    assert len(workload.model.blocks) == 2 and workload.params["layers"] == 2
    assert workload.params["task"] == "image-classification"
    assert workload.tokens_per_step == 2 * ((64 // 16) ** 2 + 1)  # patches and the class token
    assert torch.isfinite(workload.step())
    resnet = arch.build(model="timm:resnet18")
    assert resnet.params["layers"] is None and resnet.tokens_per_step == 2  # images
    with pytest.raises(ValueError, match="takes no int depth"):
        arch.build(model="timm:resnet18", layers=2)
    with pytest.raises(ValueError, match="model='timm:resnet_nope' is not in timm's registry"):
        arch.build(model="timm:resnet_nope")


def test_a_timm_model_that_refuses_the_small_images_gets_its_registered_size():
    # halonet's attention blocks must divide the last feature map: 64 x 64 images leave 2 x 2
    from levers.workloads.arch import timm_models

    assert timm_models.shrink_kwargs("halonet_h1", "tiny", None)[1]["image_size"] == (256, 256)
    assert timm_models.shrink_kwargs("resnet18", "tiny", None)[1]["image_size"] == (64, 64)
    workload = arch.build(model="timm:halonet_h1", batch_size=1)
    assert torch.isfinite(workload.step())


def test_a_timm_model_whose_function_sets_its_own_depth_is_built_at_that_depth():
    # gmlp_ti16_224's registered function passes num_blocks=30 itself, though MlpMixer takes it:
    # a second num_blocks was a TypeError from dict(), and the arch sweep lost the model
    workload = arch.build(model="timm:gmlp_ti16_224", batch_size=1)
    assert workload.params["layers"] is None and len(workload.model.blocks) == 30
    assert torch.isfinite(workload.step())
    with pytest.raises(ValueError, match="sets its own num_blocks"):
        arch.build(model="timm:gmlp_ti16_224", layers=2)
    assert len(arch.build(model="timm:mixer_s16_224").model.blocks) == 8  # the same family


def test_without_timm_a_timm_model_says_what_to_install(monkeypatch):
    import importlib.util

    from levers.errors import MissingDependency

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "timm" else real(name, *a))
    with pytest.raises(MissingDependency, match="pip install timm"):
        arch.build(model="timm:resnet18")


@pytest.mark.parametrize("model", ["xlnet", "levit"])
def test_a_parameter_made_by_a_legacy_constructor_is_moved_to_the_device_with_the_rest(model):
    # XLNet makes its attention weights with torch.FloatTensor(...), which ignores the default
    # device: on a GPU they stayed on the CPU; the prediction on fake tensors sees it so. Only
    # those are moved: Module.to would swap every parameter, which LeViT's fake ones refuse
    from levers.hardware import resolve_gpu
    from levers.memory.prediction import run_prediction, source_of

    prediction = run_prediction(
        source_of("arch", {"model": model, "size": "tiny"}), resolve_gpu("h200"), num_steps=1
    )
    assert prediction.replay.peak_allocated_bytes > 0


@pytest.mark.parametrize("switch", ["1", None], ids=["switch-on", "switch-off"])
def test_a_fresh_process_builds_llama_past_torchvision_or_says_what_to_do(switch):
    # llama's config module imports torchvision: without levers' import past it first, a
    # torchvision whose compiled operators do not load (PyPI's, beside a CPU torch) read as
    # "needs a package that is missing: Could not import module 'LlamaConfig'"
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "LEVERS_TORCHVISION_WITHOUT_OPS"}
    if switch is not None:
        env["LEVERS_TORCHVISION_WITHOUT_OPS"] = switch
    result = subprocess.run(
        [sys.executable, "-m", "levers.cli.command", "memory", "arch", "--set", "model=llama",
         "--gpu", "h200"], capture_output=True, text=True, env=env, timeout=300)
    assert "Could not import module" not in result.stderr
    if result.returncode != 0:  # only where torchvision's operators do not load here
        assert switch is None and result.returncode in (2, 3), result.stderr
        assert "set LEVERS_TORCHVISION_WITHOUT_OPS=1" in result.stderr
    else:
        assert "peak" in result.stdout


def test_a_config_that_ships_no_width_gets_its_fit_check_at_the_shipped_size():
    # ResNet's config has no hidden_size: at size=full its shape's width is None, and the fit
    # check's floor (before any build) raised a TypeError there
    from levers.workloads.zoo import step_floor

    entry = arch.entry("resnet", "image-classification")
    shape = {**entry.sizes["full"], "param_dtype": torch.float32}
    assert shape["width"] is None
    floor = step_floor(entry, shape)
    assert floor.parameters == 0
    assert floor.batch_bytes == shape["batch_size"] * 3 * 224 * 224 * 4


def test_at_full_a_nested_config_the_others_derive_from_is_passed_as_shipped():
    # Moshi's depth decoder takes its audio vocabulary from the audio encoder's dict: passing
    # the decoder's own dict alone left it None, which its strict config refused
    entry = arch.entry("moshi", "causal-lm")
    with torch.device("meta"):
        model = entry.make_model({**entry.sizes["full"], "param_dtype": torch.float32})
    config = model.config
    assert config.hidden_size == 2048
    assert config.audio_vocab_size == config.depth_decoder_config.audio_vocab_size == 2048
    assert config.depth_decoder_config.input_size == 2048
