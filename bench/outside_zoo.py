"""Workload factories for model families outside the zoo, built from their configs as shipped,
for issue 33's tune-against-the-peers rows (bench/tune_sweep.py).

    PYTHONPATH=src python bench/tune_sweep.py --models bench/outside_zoo.py:make@opt ...
    levers tune bench/outside_zoo.py:make --set model=bloom size=tiny --budget 60

``make(model=..., size=..., device=..., batch_size=..., layers=...)``: ``model`` is a key of
:data:`FAMILIES`; every config field not set here keeps its default (dropout, positions, tied
embeddings, the vocabulary where the family ships one), as a user's ``AutoConfig.for_model``
would. The step is the zoo's (a fresh seeded batch, the model's own loss, bf16 autocast on a GPU,
fused AdamW).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from levers.workload import Workload  # noqa: E402
from levers.workloads import _params, _runtime  # noqa: E402
from levers.workloads.zoo import training_step  # noqa: E402
from levers.workloads.zoo.spec import Shape, ZooModel, hf_loss, token_ids  # noqa: E402


def _decoder_batch(shape: Shape, generator: torch.Generator) -> dict[str, torch.Tensor]:
    ids_bt = token_ids(shape, generator)
    return {"input_ids": ids_bt, "labels": ids_bt}


def _masked_batch(shape: Shape, generator: torch.Generator) -> dict[str, torch.Tensor]:
    ids_bt = token_ids(shape, generator)
    masked_bt = torch.rand(ids_bt.shape, generator=generator, device=generator.device) < 0.15
    labels_bt = torch.where(masked_bt, ids_bt, torch.full_like(ids_bt, -100))
    return {"input_ids": torch.where(masked_bt, torch.zeros_like(ids_bt), ids_bt),
            "labels": labels_bt}


# family -> (task, config fields from the shape, full shape); the tiny shape is shared
FAMILIES: dict[str, tuple[str, Any, Shape]] = {
    # learned positions, ReLU MLP, dropout 0.1 as shipped, tied head
    "opt": ("causal", lambda s: {
        "vocab_size": s["vocab_size"], "hidden_size": s["width"], "ffn_dim": 4 * s["width"],
        "num_hidden_layers": s["layers"], "num_attention_heads": s["heads"],
        "word_embed_proj_dim": s["width"], "max_position_embeddings": s["seq_len"],
    }, {"width": 2048, "layers": 8, "heads": 32, "vocab_size": 50272, "seq_len": 2048,
        "batch_size": 8}),
    # ALiBi, its 250,880-token vocabulary as shipped
    "bloom": ("causal", lambda s: {
        "vocab_size": s["vocab_size"], "hidden_size": s["width"], "n_layer": s["layers"],
        "n_head": s["heads"],
    }, {"width": 2048, "layers": 8, "heads": 16, "vocab_size": 250880, "seq_len": 2048,
        "batch_size": 8}),
    # parallel residual, rotary on a quarter of each head
    "gpt_neox": ("causal", lambda s: {
        "vocab_size": s["vocab_size"], "hidden_size": s["width"],
        "intermediate_size": 4 * s["width"], "num_hidden_layers": s["layers"],
        "num_attention_heads": s["heads"], "max_position_embeddings": s["seq_len"],
    }, {"width": 2048, "layers": 8, "heads": 16, "vocab_size": 50432, "seq_len": 2048,
        "batch_size": 8}),
    # an encoder masked LM with disentangled relative attention
    "deberta-v2": ("masked", lambda s: {
        "vocab_size": s["vocab_size"], "hidden_size": s["width"],
        "intermediate_size": 4 * s["width"], "num_hidden_layers": s["layers"],
        "num_attention_heads": s["heads"], "max_position_embeddings": s["seq_len"],
    }, {"width": 768, "layers": 12, "heads": 12, "vocab_size": 128100, "seq_len": 512,
        "batch_size": 32}),
}
TINY: Shape = {"width": 64, "layers": 2, "heads": 4, "vocab_size": 512, "seq_len": 32,
               "batch_size": 2}


def _entry(model: str) -> ZooModel:
    task, fields, full = FAMILIES[model]

    def make_model(shape: Shape) -> torch.nn.Module:
        import transformers

        config = transformers.AutoConfig.for_model(model, **fields(shape))
        auto = (transformers.AutoModelForCausalLM if task == "causal"
                else transformers.AutoModelForMaskedLM)
        return auto.from_config(config)

    tiny = {**TINY, "vocab_size": TINY["vocab_size"]}
    return ZooModel(
        name=model, family="decoder" if task == "causal" else "encoder",
        library="transformers", sizes={"tiny": tiny, "full": full}, make_model=make_model,
        make_batch=_decoder_batch if task == "causal" else _masked_batch, loss=hf_loss,
        tokens_per_step=lambda s: s["batch_size"] * s["seq_len"],
    )


def make(
    model: str = "opt", size: str = "tiny", device: Any = "cpu", seed: Any = 0,
    batch_size: Any = None, layers: Any = None,
) -> Workload:
    _params.choice("model", model, tuple(FAMILIES))
    _params.choice("size", size, ("tiny", "full"))
    entry = _entry(model)
    resolved_device = _params.device(device)
    resolved_seed = _params.integer("seed", seed)
    shape = dict(entry.sizes[size])
    if batch_size is not None:
        shape["batch_size"] = _params.positive_int("batch_size", batch_size)
    if layers is not None:
        shape["layers"] = _params.positive_int("layers", layers)
    with _runtime.seeded(resolved_seed, resolved_device), resolved_device:
        module = entry.make_model(shape)
    module.train()
    optimizer = _runtime.adamw(module, lr=1e-4)
    generator = _runtime.data_generator(resolved_seed, resolved_device)
    return Workload(
        model=module,
        step=training_step(entry, module, optimizer, shape, generator),
        tokens_per_step=entry.tokens_per_step(shape),
        optimizer=optimizer,
        name=f"{model}-{size}",
        params={"model": model, "size": size, "device": str(resolved_device),
                "seed": resolved_seed, "batch_size": shape["batch_size"],
                "layers": shape["layers"]},
        device=resolved_device,
    )
