"""The zoo's text models from transformers: decoder LLMs, a mixture-of-experts, an encoder
masked LM and an encoder-decoder, each from its config class with the shapes set and every
other field left at its default (dropout, ``use_cache``, activations, tied embeddings)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from levers.optional import import_transformers
from levers.workloads.zoo.spec import (
    Shape,
    ZooModel,
    causal_lm_batch,
    hf_loss,
    masked_lm_batch,
    token_ids,
)


def _transformers() -> Any:
    return import_transformers()


def _causal_lm(config_class: str, fields: Callable[[Shape], dict[str, Any]]):
    def make(shape: Shape) -> torch.nn.Module:
        transformers = _transformers()
        config = getattr(transformers, config_class)(**fields(shape))
        return transformers.AutoModelForCausalLM.from_config(config)

    return make


def _tokens(shape: Shape) -> int:
    return shape["batch_size"] * shape["seq_len"]


def _llama_fields(shape: Shape) -> dict[str, Any]:
    return {
        "vocab_size": shape["vocab_size"],
        "hidden_size": shape["width"],
        "intermediate_size": shape["ffn"],
        "num_hidden_layers": shape["layers"],
        "num_attention_heads": shape["heads"],
        "num_key_value_heads": shape["kv_heads"],
        "max_position_embeddings": max(shape["seq_len"], 2048),
    }


def _decoder(name: str, config_class: str, full: Shape, fields=_llama_fields, **tiny: Any):
    tiny_shape = {
        "width": 64, "ffn": 128, "layers": 2, "heads": 4, "kv_heads": 2, "vocab_size": 512,
        "seq_len": 32, "batch_size": 2, **tiny,
    }
    return ZooModel(
        name=name,
        family="decoder",
        library="transformers",
        sizes={"tiny": tiny_shape, "full": full},
        make_model=_causal_lm(config_class, fields),
        make_batch=causal_lm_batch,
        loss=hf_loss,
        tokens_per_step=_tokens,
    )


def _gpt2_fields(shape: Shape) -> dict[str, Any]:
    return {
        "vocab_size": shape["vocab_size"],
        "n_positions": shape["seq_len"],
        "n_embd": shape["width"],
        "n_layer": shape["layers"],
        "n_head": shape["heads"],
        # the shipped ids (50256) lie outside a tiny vocabulary; transformers warns of them
        "bos_token_id": shape["vocab_size"] - 1,
        "eos_token_id": shape["vocab_size"] - 1,
    }


def _gemma_fields(shape: Shape) -> dict[str, Any]:
    return {**_llama_fields(shape), "head_dim": shape["width"] // shape["heads"]}


def _mixtral_fields(shape: Shape) -> dict[str, Any]:
    return {
        **_llama_fields(shape),
        "num_local_experts": shape["experts"],
        "num_experts_per_tok": shape["experts_per_token"],
    }


GPT2 = _decoder(
    "gpt2", "GPT2Config",
    # GPT-2 medium's width with 8 blocks at batch 8 x 1024 (the shape of issue 20's A/B)
    {"width": 1024, "layers": 8, "heads": 16, "vocab_size": 50257, "seq_len": 1024,
     "batch_size": 8},
    fields=_gpt2_fields,
)
LLAMA = _decoder(
    "llama", "LlamaConfig",
    {"width": 2048, "ffn": 5632, "layers": 16, "heads": 16, "kv_heads": 16, "vocab_size": 32000,
     "seq_len": 2048, "batch_size": 4},
)
QWEN2 = _decoder(
    "qwen2", "Qwen2Config",
    # Qwen2-0.5B's shapes
    {"width": 896, "ffn": 4864, "layers": 24, "heads": 14, "kv_heads": 2, "vocab_size": 151936,
     "seq_len": 2048, "batch_size": 4},
)
MISTRAL = _decoder(
    "mistral", "MistralConfig",
    {"width": 2048, "ffn": 5632, "layers": 16, "heads": 16, "kv_heads": 8, "vocab_size": 32000,
     "seq_len": 2048, "batch_size": 4},
)
GEMMA = _decoder(
    "gemma", "GemmaConfig",
    # Gemma-2B's width and vocabulary with 8 of its 18 blocks (~1.3B parameters)
    {"width": 2048, "ffn": 16384, "layers": 8, "heads": 8, "kv_heads": 1, "vocab_size": 256000,
     "seq_len": 1024, "batch_size": 4},
    fields=_gemma_fields,
)
PHI = _decoder(
    "phi", "PhiConfig",
    # phi-1.5's width with 12 of its 24 blocks
    {"width": 2048, "ffn": 8192, "layers": 12, "heads": 32, "kv_heads": 32, "vocab_size": 51200,
     "seq_len": 2048, "batch_size": 4},
    kv_heads=4,
)
MIXTRAL = ZooModel(
    name="mixtral",
    family="moe",
    library="transformers",
    sizes={
        "tiny": {"width": 64, "ffn": 128, "layers": 2, "heads": 4, "kv_heads": 2,
                 "vocab_size": 512, "seq_len": 32, "batch_size": 2, "experts": 4,
                 "experts_per_token": 2},
        "full": {"width": 1024, "ffn": 3584, "layers": 8, "heads": 16, "kv_heads": 8,
                 "vocab_size": 32000, "seq_len": 1024, "batch_size": 4, "experts": 8,
                 "experts_per_token": 2},
    },
    make_model=_causal_lm("MixtralConfig", _mixtral_fields),
    make_batch=causal_lm_batch,
    loss=hf_loss,
    tokens_per_step=_tokens,
)


def _bert_model(shape: Shape) -> torch.nn.Module:
    transformers = _transformers()
    config = transformers.BertConfig(
        vocab_size=shape["vocab_size"],
        hidden_size=shape["width"],
        num_hidden_layers=shape["layers"],
        num_attention_heads=shape["heads"],
        intermediate_size=shape["ffn"],
        max_position_embeddings=max(shape["seq_len"], 512),
    )
    return transformers.BertForMaskedLM(config)


BERT = ZooModel(
    name="bert",
    family="encoder",
    library="transformers",
    sizes={
        "tiny": {"width": 64, "ffn": 128, "layers": 2, "heads": 4, "vocab_size": 512,
                 "seq_len": 32, "batch_size": 2},
        # bert-base at batch 32 x 512
        "full": {"width": 768, "ffn": 3072, "layers": 12, "heads": 12, "vocab_size": 30522,
                 "seq_len": 512, "batch_size": 32},
    },
    make_model=_bert_model,
    make_batch=masked_lm_batch,
    loss=hf_loss,
    tokens_per_step=_tokens,
)


def _t5_model(shape: Shape) -> torch.nn.Module:
    transformers = _transformers()
    config = transformers.T5Config(
        vocab_size=shape["vocab_size"],
        d_model=shape["width"],
        d_kv=shape["width"] // shape["heads"],
        d_ff=shape["ffn"],
        num_layers=shape["layers"],
        num_decoder_layers=shape["layers"],
        num_heads=shape["heads"],
        # what the t5 checkpoints ship (the pad id); transformers 5's T5Config has no default
        decoder_start_token_id=0,
    )
    return transformers.T5ForConditionalGeneration(config)


def _t5_batch(shape: Shape, generator: torch.Generator) -> dict[str, torch.Tensor]:
    # the model builds the decoder's inputs from the labels (shifted right)
    return {
        "input_ids": token_ids(shape, generator),
        "labels": token_ids(shape, generator, length_key="target_len"),
    }


T5 = ZooModel(
    name="t5",
    family="encoder-decoder",
    library="transformers",
    sizes={
        "tiny": {"width": 64, "ffn": 128, "layers": 2, "heads": 4, "vocab_size": 512,
                 "seq_len": 32, "target_len": 16, "batch_size": 2},
        # t5-base at batch 16, 512 input and 128 target tokens
        "full": {"width": 768, "ffn": 3072, "layers": 12, "heads": 12, "vocab_size": 32128,
                 "seq_len": 512, "target_len": 128, "batch_size": 16},
    },
    make_model=_t5_model,
    make_batch=_t5_batch,
    loss=hf_loss,
    tokens_per_step=lambda shape: shape["batch_size"] * (shape["seq_len"] + shape["target_len"]),
)

MODELS = (GPT2, LLAMA, QWEN2, MISTRAL, GEMMA, PHI, MIXTRAL, BERT, T5)
