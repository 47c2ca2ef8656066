"""The ``arch`` workload's transformers architectures: every model type of transformers' auto
mappings for causal LM, masked LM, seq2seq LM and image classification, built from its config
class's defaults (``AutoConfig.for_model``) with only the shape fields set, and random weights
(``AutoModelFor<Task>.from_config``: no hub access, no tokenizer).

Shape fields are found by name, since configs spell them differently (``hidden_size``,
``d_model``, ``n_embd``, ``dim``; ``num_hidden_layers``, ``n_layer``, ``encoder_layers``...):

- width, layers, heads as the size says; key-value heads, head dims, feed-forward widths (every
  ``*_ffn_dim``, ``intermediate_size``, ``d_ff``, the experts' own) keep their shipped ratio to
  the heads or the width; a field whose declared default is ``None`` is derived by the config
  itself and left alone;
- experts capped at the size's count, experts per token at its top-k, expert groups at one;
  per-layer lists (``layer_types``, ``mlp_layer_types``...) cut to the depth keeping one layer of
  each kind the shipped list has (a sliding and a full attention layer; a dense and a sparse MLP);
- the vocabulary at ``tiny`` (token ids past it moved inside it); position tables at least the
  sequence; an image classifier's ``image_size``, depths per stage and labels.

Everything else (dropout, activations, positional scheme, tied embeddings, ``use_cache``) keeps
its shipped default. A model type whose config nests others (a vision-language model's
``text_config`` and ``vision_config``, an audio model's encoder, MPT's ``attn_config``) gets each
nested config shrunk by the same rules over what its parent ships: the text ones at the shape,
the towers at ``tiny`` to a 64-wide, 2-block stack (at ``full`` as shipped), an image
classifier's ``vision_config`` at the classifier's shape. A vision-language model's step is
text-only (its towers are built and not run), with token ids drawn below its image, audio and
video token ids; a config that nests others without defaults for them is refused with the
reason.
"""

from __future__ import annotations

import dataclasses
import functools
import pathlib
import sys
from collections.abc import Callable
from typing import Any

import torch

from levers.errors import LeversError
from levers.optional import import_transformers
from levers.workloads.zoo.spec import (
    Shape,
    ZooModel,
    causal_lm_batch,
    hf_loss,
    images,
    masked_lm_batch,
    token_ids,
)

TASKS = ("causal-lm", "masked-lm", "seq2seq", "image-classification")
_MAPPINGS = {
    "causal-lm": "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
    "masked-lm": "MODEL_FOR_MASKED_LM_MAPPING_NAMES",
    "seq2seq": "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",
    "image-classification": "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES",
}
_AUTO_CLASSES = {
    "causal-lm": "AutoModelForCausalLM",
    "masked-lm": "AutoModelForMaskedLM",
    "seq2seq": "AutoModelForSeq2SeqLM",
    "image-classification": "AutoModelForImageClassification",
}

# the sizes of each task: ``tiny`` runs a step in well under a second on a CPU; ``full`` is a
# realistic shape for one H200 (a ~1B decoder at batch 8 x 2048, bert-base at batch 32 x 512,
# t5-base at batch 16 x (512 + 128); an image classifier at its shipped config, batch 64).
# vocab_size None: the config's own; an image classifier's None fields: the config's own.
_TEXT_TINY = {"width": 64, "heads": 4, "layers": 2, "vocab_size": 512, "seq_len": 32,
              "batch_size": 2, "experts": 4, "experts_per_token": 2}
SIZES: dict[str, dict[str, Shape]] = {
    "causal-lm": {
        "tiny": _TEXT_TINY,
        "full": {"width": 2048, "heads": 16, "layers": 8, "vocab_size": None, "seq_len": 2048,
                 "batch_size": 8, "experts": 8, "experts_per_token": 2},
    },
    "masked-lm": {
        "tiny": _TEXT_TINY,
        "full": {"width": 768, "heads": 12, "layers": 12, "vocab_size": None, "seq_len": 512,
                 "batch_size": 32, "experts": 8, "experts_per_token": 2},
    },
    "seq2seq": {
        "tiny": {**_TEXT_TINY, "target_len": 16},
        "full": {"width": 768, "heads": 12, "layers": 12, "vocab_size": None, "seq_len": 512,
                 "target_len": 128, "batch_size": 16, "experts": 8, "experts_per_token": 2},
    },
    "image-classification": {
        # layers None: 2 blocks for a single stack, 1 (the shallowest stage) for stages
        # window_size: a windowed attention's, at most the last stage's side (Swin's: 64 / 4 / 8)
        "tiny": {"image_size": 64, "width": 64, "heads": 4, "layers": None, "num_labels": 10,
                 "batch_size": 2, "window_size": 2},
        "full": {"image_size": None, "width": None, "heads": None, "layers": None,
                 "num_labels": 1000, "batch_size": 64, "window_size": None},
    },
}

_WIDTH = ("hidden_size", "d_model", "n_embd", "dim", "emb_dim", "embed_dim", "d_embed")
_LAYERS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "encoder_layers",
           "decoder_layers", "num_decoder_layers", "num_encoder_layers", "num_blocks")
_HEADS = ("num_attention_heads", "n_head", "num_heads", "n_heads", "encoder_attention_heads",
          "decoder_attention_heads")
_KV_HEADS = ("num_key_value_heads", "num_kv_heads", "n_kv_heads", "multi_query_group_num")
_HEAD_DIM = ("head_dim", "d_kv", "kv_channels", "attention_head_size", "d_head")
# parts of a head (rotary, multi-head latent attention's): keep their share of the head
_HEAD_PARTS = ("rotary_dim", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")
# sizes that follow the width: factorised embeddings, bottlenecks, latent ranks
_BY_WIDTH = ("embedding_size", "embed_size", "intra_bottleneck_size", "kv_lora_rank",
             "q_lora_rank")
_FFN = ("intermediate_size", "ffn_dim", "encoder_ffn_dim", "decoder_ffn_dim", "d_ff", "d_inner",
        "n_inner", "ffn_hidden_size", "moe_intermediate_size", "shared_expert_intermediate_size",
        "hidden_dim")
_POSITIONS = ("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len",
              "max_sequence_length", "max_target_positions", "max_source_positions")
_VOCAB = ("vocab_size", "src_vocab_size", "tgt_vocab_size", "decoder_vocab_size",
          "vocab_size_per_layer_input")
_EXPERTS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
_TOP_K = ("num_experts_per_tok", "moe_topk", "moe_top_k", "top_k", "num_experts_per_token",
          "moe_k", "num_selected_experts")
_EXPERT_GROUPS = ("n_group", "topk_group")
_DENSE_FIRST = ("first_k_dense_replace", "num_dense_layers")
# every how many layers a kind of layer comes, and where in the period (Jamba's attention)
_PERIODS = ("attn_layer_period", "expert_layer_period")
_OFFSETS = {"attn_layer_offset": "attn_layer_period", "expert_layer_offset": "expert_layer_period"}
# a cycle of layer kinds shorter than the depth (RecurrentGemma's recurrent, recurrent, attention)
_CYCLES = ("block_types",)
# an image classifier's blocks per stage
_STAGE_DEPTHS = ("depths", "depth", "num_block_repeats", "n_attn_blocks", "stage_num_blocks")


def _transformers() -> Any:
    return import_transformers()


def mapping(task: str) -> dict[str, str]:
    """model type -> the class name transformers' auto mapping builds for ``task``."""
    _transformers()  # first: past a torchvision whose compiled operators do not load
    from transformers.models.auto import modeling_auto

    return dict(getattr(modeling_auto, _MAPPINGS[task]))


def tasks_of(model_type: str) -> tuple[str, ...]:
    return tuple(task for task in TASKS if model_type in mapping(task))


def architectures() -> list[tuple[str, str]]:
    """Every (model type, task) of the four auto mappings, in the mappings' order."""
    return [(model_type, task) for task in TASKS for model_type in mapping(task)]


def _ints(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _declared(config_class: type) -> dict[str, Any]:
    """The config's fields with their declared defaults (None: derived in ``__post_init__``;
    a field with a default factory reads as explicit)."""
    if not dataclasses.is_dataclass(config_class):
        return {}
    return {
        f.name: (f.default if f.default is not dataclasses.MISSING else ...)
        for f in dataclasses.fields(config_class)
    }


def _value(config: Any, name: str) -> Any:
    """``config.name``, or None where the config refuses a global value (a per-layer one)."""
    try:
        return getattr(config, name, None)
    except Exception:  # noqa: BLE001 - transformers' per-layer attributes raise on global reads
        return None


def _present(names: tuple[str, ...], declared: dict[str, Any], default: Any) -> list[str]:
    """The names the config declares with an explicit int (or int list) default."""
    return [
        n for n in names
        if n in declared and declared[n] is not None
        and (_ints(_value(default, n)) or _int_list(_value(default, n)))
    ]


def _unset(names: tuple[str, ...], declared: dict[str, Any], default: Any) -> list[str]:
    """The names the config declares but leaves None even after its own derivations (a model
    that reads them fails on the shipped defaults)."""
    return [n for n in names if n in declared and _value(default, n) is None]


def _int_list(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and bool(value) and all(_ints(v) for v in value)


def _first(names: list[str], default: Any) -> int | None:
    for name in names:
        value = _value(default, name)
        if _ints(value):
            return value
    return None


def _multiple_of(value: float, step: int) -> int:
    return max(step, int(round(value / step)) * step)


def keep_kinds(values: list[Any], length: int) -> list[Any]:
    """``length`` entries of a per-layer list, in order, keeping the first layer of each kind
    (``["dense"] * 3 + ["sparse"] * 58`` at 2 layers: ``["dense", "sparse"]``)."""
    if length >= len(values):
        return [values[i % len(values)] for i in range(length)]
    firsts: list[int] = []
    for i, value in enumerate(values):
        if all(values[j] != value for j in firsts):
            firsts.append(i)
    chosen = firsts[:length]
    chosen += [i for i in range(len(values)) if i not in chosen][: length - len(chosen)]
    return [values[i] for i in sorted(chosen)]


def text_fields(config_class: type, shape: Shape, default: Any = None) -> dict[str, Any]:
    """The shape fields of a transformer's config (text, or a single-stack vision model) at
    ``shape``'s width, depth and heads; see the module docstring. ``default``: the shipped
    config the ratios are kept from (a nested config's, as its parent ships it)."""
    declared = _declared(config_class)
    default = config_class() if default is None else default
    fields: dict[str, Any] = {}
    widths = _present(_WIDTH, declared, default)
    heads = _present(_HEADS, declared, default)
    width0, heads0 = _first(widths, default), _first(heads, default)
    width, num_heads = shape.get("width"), shape.get("heads")
    if width is not None and width0 is not None:
        fields.update({n: width for n in widths if _ints(_value(default, n))})
        if heads0 is not None:
            fields.update(_head_fields(declared, default, heads, heads0, width, num_heads,
                                       width0))
        scale = lambda v, step=8: _multiple_of(v * width / width0, step)  # noqa: E731
        for name in _present(_FFN, declared, default):
            value = _value(default, name)
            fields[name] = [scale(v) for v in value] if _int_list(value) else scale(value)
        for name in _present(_BY_WIDTH, declared, default):
            if _ints(_value(default, name)):
                fields[name] = scale(_value(default, name))
    layers0 = _first(_present(_LAYERS, declared, default), default)
    layers = shape["layers"]
    fields.update({n: layers for n in _present(_LAYERS, declared, default)
                   if _ints(_value(default, n))})
    if layers0 is not None and layers != layers0:
        for name, value in default.to_dict().items():
            # a per-layer list the shipped config spells out (or derives from its depth)
            if name in declared and isinstance(value, list) and len(value) == layers0 > 1:
                fields[name] = keep_kinds(fields.get(name, value), layers)
    _layer_kinds(fields, declared, default, layers)
    _experts(fields, declared, default, shape, layers)
    _vocabulary(fields, declared, default, shape.get("vocab_size"))
    longest = max(shape.get("seq_len", 0), shape.get("target_len", 0))
    longest += position_offset(config_class, default)
    for name in _present(_POSITIONS, declared, default):
        if _ints(_value(default, name)) and _value(default, name) < longest:
            fields[name] = longest
    return fields


# how transformers' RoBERTa family numbers positions: from the padding index up, so n tokens
# take positions padding_idx + 1 ... padding_idx + n (its checkpoints ship 514 positions for 512
# tokens; the default configs ship 512)
_PADDED_POSITIONS = ("create_position_ids_from_input_ids", "padding_idx + 1")


def position_offset(config_class: type, default: Any) -> int:
    """How many positions past the sequence's length a model of ``config_class`` numbers:
    ``pad_token_id + 1`` where its modeling code counts positions from the padding index (at
    512 tokens and the 512 positions of ibert's default config, a gather out of range: a
    device-side assert on a GPU), else 0."""
    pad = getattr(default, "pad_token_id", None)
    if not isinstance(pad, int) or pad < 0:
        return 0
    module = sys.modules.get(config_class.__module__)
    path = getattr(module, "__file__", None) or ""
    if "configuration_" not in path:
        return 0
    return pad + 1 if _numbers_from_padding(path.replace("configuration_", "modeling_")) else 0


@functools.cache
def _numbers_from_padding(modeling: str) -> bool:
    """Whether the modeling source at ``modeling`` numbers positions from the padding index (read
    once a file: each entry's tiny and full shapes ask)."""
    path = pathlib.Path(modeling)
    if not path.is_file():
        return False
    source = path.read_text(encoding="utf-8", errors="replace")
    return any(marker in source for marker in _PADDED_POSITIONS)


def _head_fields(declared: dict[str, Any], default: Any, heads: list[str], heads0: int,
                 width: int, num_heads: int, width0: int) -> dict[str, Any]:
    """Heads, key-value heads, the head dimension and its parts at ``num_heads`` heads."""
    fields: dict[str, Any] = {n: num_heads for n in heads if _ints(_value(default, n))}
    for name in _present(_KV_HEADS, declared, default):
        kv0 = _value(default, name)
        if _ints(kv0):
            kv = max(1, num_heads * kv0 // heads0)
            fields[name] = kv if num_heads % kv == 0 else num_heads
    for name in _unset(_KV_HEADS, declared, default):
        fields[name] = num_heads  # None left for the model to read: one per query head
    head_dim = width // num_heads
    head_dims = _present(_HEAD_DIM, declared, default)
    head_dim0 = _first(head_dims, default) or width0 // heads0
    for name in head_dims + _unset(_HEAD_DIM, declared, default):
        fields[name] = head_dim
    for name in _present(_HEAD_PARTS, declared, default):
        if _ints(_value(default, name)):
            fields[name] = _multiple_of(_value(default, name) * head_dim / head_dim0, 2)
    return fields


def _layer_kinds(fields: dict[str, Any], declared: dict[str, Any], default: Any,
                 layers: int) -> None:
    """Where each kind of layer goes, within ``layers``: periods at most the depth, offsets
    inside the period, a cycle of kinds cut so that each kind still comes."""
    for name in _present(_PERIODS, declared, default):
        fields[name] = min(_value(default, name), layers)
    for name, period in _OFFSETS.items():
        if name in _present((name,), declared, default):
            within = fields.get(period, _value(default, period) or layers)
            fields[name] = min(_value(default, name), within - 1)
    for name in _CYCLES:
        value = _value(default, name)
        if name in declared and isinstance(value, (list, tuple)) and len(value) > layers:
            fields[name] = keep_kinds(list(value), layers)


def _experts(fields: dict[str, Any], declared: dict[str, Any], default: Any, shape: Shape,
             layers: int) -> None:
    experts = [n for n in _present(_EXPERTS, declared, default)
               if _ints(_value(default, n)) and _value(default, n) > 1]
    if not experts or "experts" not in shape:
        return
    count = min(_value(default, experts[0]), shape["experts"])
    fields.update({n: min(_value(default, n), shape["experts"]) for n in experts})
    for name in _present(_TOP_K, declared, default):
        fields[name] = min(_value(default, name), shape["experts_per_token"], count)
    for name in _unset(_TOP_K, declared, default):
        fields[name] = min(shape["experts_per_token"], count)
    for name in _present(_EXPERT_GROUPS, declared, default):
        fields[name] = 1  # the groups of experts a token's experts are drawn from
    for name in _present(_DENSE_FIRST, declared, default):
        fields[name] = min(_value(default, name), max(1, layers // 2))


def _vocabulary(fields: dict[str, Any], declared: dict[str, Any], default: Any,
                vocab_size: int | None) -> None:
    if vocab_size is None:
        return
    for name in _present(_VOCAB, declared, default):
        fields[name] = vocab_size
    # the shipped special token ids (50256, 128000...) must lie inside a smaller vocabulary
    for name, value in default.to_dict().items():
        if not (name.endswith(("_token_id", "_token_ids", "_token_index")) and name in declared):
            continue
        if _ints(value) and value >= vocab_size:
            fields[name] = vocab_size - 1
        elif _int_list(value) and any(v >= vocab_size for v in value):
            fields[name] = [min(v, vocab_size - 1) for v in value]


def vision_fields(config_class: type, shape: Shape, default: Any = None) -> dict[str, Any]:
    """An image classifier's fields: a single stack (ViT-like: int width and heads) shrinks as
    a text model does; stages keep their widths and get ``layers`` blocks in the shallowest
    stage (the others keep their share); the image size and labels as the shape says."""
    declared = _declared(config_class)
    default = config_class() if default is None else default
    fields: dict[str, Any] = {"num_labels": shape["num_labels"]}
    if _single_stack(config_class, default):
        fields.update(text_fields(config_class, shape, default))
    else:
        for name in _present(_STAGE_DEPTHS, declared, default):
            depths = getattr(default, name)
            if _int_list(depths):
                least = min([d for d in depths if d > 0] or [1])
                fields[name] = [shape["layers"] * d // least for d in depths]
    window = shape.get("window_size")
    if window is not None and _ints(getattr(default, "window_size", None)):
        fields["window_size"] = window
    size = shape.get("image_size")
    if size is not None and "image_size" in declared:
        shipped = getattr(default, "image_size")
        fields["image_size"] = [size, size] if isinstance(shipped, (list, tuple)) else size
    return fields


def _single_stack(config_class: type, default: Any = None) -> bool:
    declared = _declared(config_class)
    default = config_class() if default is None else default
    widths = [n for n in _present(_WIDTH, declared, default) if _ints(_value(default, n))]
    heads = [n for n in _present(_HEADS, declared, default) if _ints(_value(default, n))]
    return bool(widths and heads and _present(_LAYERS, declared, default))


def _config_class(model_type: str) -> type:
    _transformers()  # first: a model type's config module may import torchvision (llama's)
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    return CONFIG_MAPPING[model_type]


# the text's own special tokens, which a text-only batch may draw
_TEXT_TOKENS = ("bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "cls_token_id",
                "unk_token_id", "mask_token_id", "decoder_start_token_id")
# a nested config shrunk as a text model (the rest, vision and audio towers, as a single stack)
_TEXT_SUBS = ("text_config", "decoder", "encoder", "text_encoder", "language_config",
              "llm_config", "global_config")
# the size of a nested tower at ``tiny`` (a vision-language model's vision tower, an audio
# encoder): a single stack as an image classifier's, stages one block in the shallowest
_TOWER_TINY = {"width": 64, "heads": 4, "layers": 2}


def nested(config_class: type) -> dict[str, Any]:
    """name -> the shipped config of each config ``config_class`` nests (a vision-language
    model's ``text_config`` and ``vision_config``, MPT's ``attn_config``); empty for a flat
    one. Raises LeversError where the nesting config has no defaults to build from."""
    names = sorted(getattr(config_class, "sub_configs", None) or {})
    if not names:
        return {}
    try:
        default = config_class()
    except Exception as exc:  # noqa: BLE001 - a config that needs its parts given
        raise LeversError(
            f"{config_class.__name__} nests other configs ({', '.join(names)}) and has no "
            f"defaults for them ({type(exc).__name__}: {str(exc)[:200]}): build its parts by "
            "their own model types"
        ) from exc
    return {name: getattr(default, name, None) for name in names}


def _shipped(sub: Any) -> dict[str, Any]:
    """A nested config's fields its parent ships at other values than the config class's own
    defaults (LLaVA's CLIP tower at 1024 wide), and its model type: what a dict passed for it
    must carry so that it is built as shipped. Fields the config derives are left out."""
    cls = type(sub)
    declared = _declared(cls)
    try:
        base = cls().to_dict()
    except Exception:  # noqa: BLE001 - a config class that needs arguments: keep every field
        base = {}
    fields = {k: v for k, v in sub.to_dict().items()
              if k in declared and declared[k] is not None and base.get(k, ...) != v}
    model_type = getattr(sub, "model_type", None)
    return {**fields, **({"model_type": model_type} if model_type else {})}


def _text_sub(name: str, sub: Any) -> bool:
    return name in _TEXT_SUBS or _ints(getattr(sub, "vocab_size", None))


def nested_fields(config_class: type, task: str, shape: Shape, size: str) -> dict[str, Any]:
    """Each nested config's fields (as dicts, over what its parent ships): the text ones at
    ``shape`` (their own vocabulary where ``shape`` has none), the towers at ``tiny`` as
    :data:`_TOWER_TINY` and at ``full`` as shipped; an image classifier's vision tower at the
    classifier's shape. A nested config the rules find nothing in keeps its default, unless
    another is passed: then it is passed too, as shipped, since a parent may derive what it
    puts in one nested dict from another it was given (Moshi's depth decoder takes its audio
    vocabulary from the audio encoder's dict, None where that is not passed)."""
    fields: dict[str, Any] = {}
    as_shipped: dict[str, Any] = {}
    for name, sub in nested(config_class).items():
        if sub is None or not hasattr(sub, "to_dict"):
            continue
        cls = type(sub)
        if task == "image-classification":
            if name != "vision_config":
                continue
            own = vision_fields(cls, shape, sub)
            own.pop("num_labels")
        elif _text_sub(name, sub):
            vocab = shape.get("vocab_size") if size == "tiny" else None
            own = text_fields(cls, {**shape, "vocab_size": vocab}, sub)
        elif size == "tiny" and _single_stack(cls, sub):
            own = text_fields(cls, {**_TOWER_TINY, "vocab_size": None}, sub)
        elif size == "tiny":
            own = vision_fields(cls, {**_TOWER_TINY, "num_labels": 0}, sub)
            own.pop("num_labels")
        else:
            own = {}
        if own:
            fields[name] = {**_shipped(sub), **own}
        elif task != "image-classification":
            as_shipped[name] = _shipped(sub)
    return {**as_shipped, **fields} if fields else fields


def _text_default(config_class: type) -> Any:
    """The shipped config of the text model: the nested ``text_config`` (or decoder) where
    there is one, else the config itself."""
    default = config_class()
    try:
        text = default.get_text_config()
    except ValueError:  # several text configs (MusicGen's text encoder and decoder)
        text = next((sub for name, sub in nested(config_class).items()
                     if name in _TEXT_SUBS[:2] and sub is not None), None)
    return default if text is None else text


def _shape_defaults(config_class: type, task: str, size: str) -> Shape:
    """The size's shape with what the config decides filled in (its vocabulary, depth, image
    size and channels), so that every field the batches and the records read is set."""
    shape = {**SIZES[task][size], "size": size}  # the size, for the nested towers
    default = config_class()
    declared = _declared(config_class)
    if task == "image-classification":
        tower = nested(config_class).get("vision_config")
        if tower is not None:  # CLIP's and SigLIP's classifiers: their vision tower
            config_class, default, declared = type(tower), tower, _declared(type(tower))
        stack = _single_stack(config_class, default)
        shipped_size = getattr(default, "image_size", None)
        if shape["image_size"] is None:
            shape["image_size"] = shipped_size if shipped_size is not None else 224
        if isinstance(shape["image_size"], list):
            shape["image_size"] = tuple(shape["image_size"])
        shape["channels"] = getattr(default, "num_channels", 3)
        if stack:
            shape["layers"] = shape["layers"] or (
                2 if size == "tiny" else _first(_present(_LAYERS, declared, default), default)
            )
            patch = getattr(default, "patch_size", None)
            shape["patch_size"] = patch if _ints(patch) else None
        else:
            depths = [getattr(default, n) for n in _present(_STAGE_DEPTHS, declared, default)]
            depths = [d for d in depths if _int_list(d)]
            shipped = min([x for x in depths[0] if x > 0] or [1]) if depths else None
            shape["layers"] = shape["layers"] or (1 if size == "tiny" else shipped)
            shape["patch_size"] = None
        return shape
    if shape["vocab_size"] is None:
        shape["vocab_size"] = getattr(_text_default(config_class), "vocab_size", None)
    if not _ints(shape["vocab_size"]):
        raise LeversError(f"{config_class.__name__} has no int vocab_size to draw token ids from")
    if nested(config_class):
        # a text-only batch: the token ids drawn stay below the parent's image, audio and video
        # token ids, which would ask for inputs the batch does not have
        fields = config_fields_of(config_class, task, shape, size)
        special = [v for k, v in {**default.to_dict(), **fields}.items()
                   if k.endswith(("_token_id", "_token_index")) and _ints(v)
                   and 0 <= v < shape["vocab_size"] and k not in _TEXT_TOKENS]
        if special:
            shape["ids_below"] = min(special)
    return shape


def _make_model(model_type: str, task: str) -> Callable[[Shape], torch.nn.Module]:
    def make(shape: Shape) -> torch.nn.Module:
        transformers = _transformers()
        fields = config_fields(model_type, task, shape, shape.get("size", "tiny"))
        config = transformers.AutoConfig.for_model(model_type, **fields)
        classes = mapping(task)[model_type]
        if isinstance(classes, (tuple, list)):
            # several classes for the task (DeiT's with and without its teacher): the auto class
            # picks by the config's architectures, which a config built from defaults lacks
            config.architectures = [classes[0]]
        return getattr(transformers, _AUTO_CLASSES[task]).from_config(config)

    return make


def _reformer(shape: Shape, default: Any) -> dict[str, Any]:
    # training needs the axial position table to factor the sequence exactly
    length = shape["seq_len"]
    first = 2 ** max(1, (length.bit_length() - 1) // 2)
    return {
        "axial_pos_shape": [first, length // first],
        "axial_pos_embds_dim": [shape["width"] // 4, shape["width"] - shape["width"] // 4],
        "attn_layers": keep_kinds(list(default.attn_layers), shape["layers"]),
        "local_attn_chunk_length": min(default.local_attn_chunk_length, length),
        "lsh_attn_chunk_length": min(default.lsh_attn_chunk_length, length),
    }


# model type -> fields the rules above cannot find by name (Shape, the shipped config)
_OVERRIDES: dict[str, Callable[[Shape, Any], dict[str, Any]]] = {
    # global and local attention alternate, written as [[kinds, repeats]]
    "gpt_neo": lambda shape, default: {
        "attention_types": [[["global", "local"], max(1, shape["layers"] // 2)]]
    },
    # its heads tile the expanded width (num_heads * head_dim == expand * hidden_size), in
    # groups of heads that share B and C
    "mamba2": lambda shape, default: {
        "head_dim": default.expand * shape["width"] // shape["heads"],
        "n_groups": min(default.n_groups, shape["heads"]),
    },
    # its adapters need a language to route through
    "xmod": lambda shape, default: {"default_language": default.languages[0]},
    "reformer": _reformer,
}


def config_fields(model_type: str, task: str, shape: Shape, size: str = "tiny") -> dict[str, Any]:
    """What ``arch`` passes to ``AutoConfig.for_model(model_type, ...)`` at ``shape``."""
    fields = config_fields_of(_config_class(model_type), task, shape, size)
    if task == "causal-lm" and model_type in mapping("masked-lm"):
        # an encoder's causal LM head (BertLMHeadModel) is a decoder only with is_decoder=True,
        # as its documentation asks
        fields["is_decoder"] = True
    if model_type in _OVERRIDES:
        fields.update(_OVERRIDES[model_type](shape, _config_class(model_type)()))
    return fields


def config_fields_of(config_class: type, task: str, shape: Shape, size: str) -> dict[str, Any]:
    """The shape's fields of ``config_class`` itself and of the configs it nests."""
    if task == "image-classification":
        if "vision_config" in nested(config_class):
            return {"num_labels": shape["num_labels"],
                    **nested_fields(config_class, task, shape, size)}
        return vision_fields(config_class, shape)
    return {**text_fields(config_class, shape), **nested_fields(config_class, task, shape, size)}


def _seq2seq_batch(shape: Shape, generator: torch.Generator) -> dict[str, torch.Tensor]:
    # the decoder reads the targets shifted right by one: no decoder_start_token_id needed
    targets_bt = token_ids({**shape, "seq_len": shape["target_len"] + 1}, generator)
    return {
        "input_ids": token_ids(shape, generator),
        "decoder_input_ids": targets_bt[:, :-1].contiguous(),
        "labels": targets_bt[:, 1:].contiguous(),
    }


def _tokens(task: str) -> Callable[[Shape], int]:
    def tokens(shape: Shape) -> int:
        batch = shape["batch_size"]
        if task == "seq2seq":
            return batch * (shape["seq_len"] + shape["target_len"])
        if task != "image-classification":
            return batch * shape["seq_len"]
        patch = shape.get("patch_size")
        if patch is None:
            return batch  # images
        size = shape["image_size"]
        height, width = size if isinstance(size, (tuple, list)) else (size, size)
        return batch * (height // patch) * (width // patch)  # patch tokens, no class token

    return tokens


_BATCHES = {
    "causal-lm": causal_lm_batch,
    "masked-lm": masked_lm_batch,
    "seq2seq": _seq2seq_batch,
    "image-classification": images,
}


def _family(config_class: type, task: str) -> str:
    if task == "image-classification":
        tower = nested(config_class).get("vision_config")
        heads = _has_heads(type(tower) if tower is not None else config_class)
        return "vision-transformer" if heads else "convnet"
    if task in ("masked-lm", "seq2seq"):
        return "encoder" if task == "masked-lm" else "encoder-decoder"
    default = _text_default(config_class)
    declared = _declared(type(default))
    moe = any(_value(default, n) > 1 for n in _present(_EXPERTS, declared, default)
              if _ints(_value(default, n)))
    return "moe" if moe else "decoder"


def _has_heads(config_class: type) -> bool:
    declared, default = _declared(config_class), config_class()
    return bool(_present(_HEADS, declared, default)) or "num_attention_heads" in declared


def _towers(config_class: type) -> list[str]:
    """The nested configs that are not text (a vision or audio tower), by name."""
    return [name for name, sub in nested(config_class).items()
            if sub is not None and not _text_sub(name, sub)]


# errors of the device, not of the batch's inputs (both are RuntimeErrors)
_DEVICE_ERRORS = tuple(e for e in (getattr(torch, "OutOfMemoryError", None),
                                   getattr(torch, "AcceleratorError", None)) if e is not None)


def _text_only_loss(model_type: str, towers: list[str]) -> Callable[..., torch.Tensor]:
    """hf_loss, with an error that says why where a model with towers refuses a text-only
    batch (GIT's captioner and the speech LMs read their image or audio features)."""

    def loss(module: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        try:
            return hf_loss(module, inputs)
        except _DEVICE_ERRORS:
            raise  # out of memory, a device-side assert: the step's size or data, not towers
        except (ValueError, RuntimeError, TypeError, IndexError, AttributeError) as exc:
            raise LeversError(
                f"arch gives {model_type} text-only batches, and its config nests "
                f"{', '.join(towers)}: its step raised {type(exc).__name__}: "
                f"{str(exc).strip().rstrip('.')[:200]}. This model needs the inputs of those "
                "towers, which arch does not draw: build its text model by its own model type "
                "where it has one, or write a factory that feeds them (README.md, Workloads)"
            ) from exc

    return loss


def entry(model_type: str, task: str) -> ZooModel:
    """The zoo entry of one (model type, task); raises LeversError when it cannot be built."""
    config_class = _config_class(model_type)
    towers = _towers(config_class) if task != "image-classification" else []
    return ZooModel(
        name=model_type,
        family=_family(config_class, task),
        library="transformers",
        sizes={size: _shape_defaults(config_class, task, size) for size in ("tiny", "full")},
        make_model=_make_model(model_type, task),
        make_batch=_BATCHES[task],
        loss=_text_only_loss(model_type, towers) if towers else hf_loss,
        tokens_per_step=_tokens(task),
    )
