"""loss-valid-rows under whole-model compile: the count of rows with a target differs per batch,
and what the compiled graphs get must not. CUDA graphs (compile-model's mode) record a graph for
each new size or int an input takes, so each graph here is called through a backend that keeps
the sizes and ints of every call: a graph met with one per batch would record one per batch (on an
H100, luke: nine in one A/B, 0.74x and then 0.97x on top of compile-model)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

import levers  # noqa: E402
from levers.levers import load_all  # noqa: E402
from levers.levers.lever import Target  # noqa: E402
from levers.levers.loss_valid_rows import IGNORE_INDEX  # noqa: E402


class _Calls:
    """A dynamo backend that runs each graph as it is and keeps, per graph, the distinct
    signatures (each tensor input's size, each int input's value) it was called with."""

    def __init__(self) -> None:
        self.signatures: list[set[tuple]] = []

    def __call__(self, graph: torch.fx.GraphModule, example_inputs: list) -> object:
        seen: set[tuple] = set()
        self.signatures.append(seen)

        def run(*args: object) -> object:
            seen.add(tuple(tuple(a.shape) if isinstance(a, torch.Tensor) else a for a in args))
            return graph.forward(*args)

        return run


def _compiled_run(model: torch.nn.Module, batches: list[dict]) -> tuple[_Calls, list[float]]:
    torch._dynamo.reset()
    calls = _Calls()
    model.compile(backend=calls)
    handle = load_all()["loss-valid-rows"].patch(Target(model=model))
    losses = []
    try:
        for batch in batches:
            loss = model(**batch).loss
            loss.backward()
            losses.append(float(loss.detach()))
    finally:
        handle()
        vars(model).pop("_compiled_call_impl", None)
        torch._dynamo.reset()
    return calls, losses


def _eager_losses(model: torch.nn.Module, batches: list[dict]) -> list[float]:
    return [float(model(**batch).loss.detach()) for batch in batches]


def _without_dropout(model: torch.nn.Module) -> torch.nn.Module:
    """The model with every dropout off (its losses then compare across runs)."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        for name in ("dropout_prob", "attention_dropout"):
            if isinstance(getattr(module, name, None), float):
                setattr(module, name, 0.0)
    return model


def test_a_masked_lm_s_graphs_meet_one_signature_per_bucket_as_the_masked_count_varies():
    torch.manual_seed(0)
    model = _without_dropout(levers.Step("zoo", params={"model": "bert"}).workload().model)
    ids = torch.randint(0, model.config.vocab_size, (4, 32))  # 128 tokens: a bucket of 8
    batches = []
    for real in range(17, 33):  # 16 counts of masked tokens: buckets 24 and 32
        labels = torch.full((ids.numel(),), IGNORE_INDEX)
        labels[torch.randperm(ids.numel())[:real]] = 1
        batches.append({"input_ids": ids, "labels": labels.reshape(ids.shape)})
    expected = _eager_losses(model, batches)
    calls, losses = _compiled_run(model, batches)
    assert losses == pytest.approx(expected, rel=1e-5)
    assert calls.signatures  # the model was compiled
    # every graph is met in at most two forms (the two buckets), however many counts there were
    assert max(len(seen) for seen in calls.signatures) <= 2
    assert sum(len(seen) for seen in calls.signatures) <= 2 * len(calls.signatures)


def test_a_causal_lm_s_graphs_meet_one_signature_per_bucket_as_the_padding_varies():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=64)
    model = LlamaForCausalLM(config)
    ids = torch.randint(0, config.vocab_size, (4, 32))  # 128 tokens: a bucket of 8
    batches = []
    for pad in range(40, 56):  # 16 counts of padding rows at the end of the rows
        labels = ids.clone().reshape(-1)
        labels[-pad:] = IGNORE_INDEX
        batches.append({"input_ids": ids, "labels": labels.reshape(ids.shape)})
    expected = _eager_losses(model, batches)
    calls, losses = _compiled_run(model, batches)
    assert losses == pytest.approx(expected, rel=1e-5)
    assert calls.signatures
    assert max(len(seen) for seen in calls.signatures) <= 3
