"""compile-blocks on a model that calls its blocks' forward by name (``layer.forward(x)``), which
skips the module call ``module.compile()`` compiles: the lever refuses, says why and names
compile-model, where before it applied and compiled nothing (transformers' SqueezeBERT, 1.000x on
an H100 in s64). Blocks called as modules (``layer(x)``) are unaffected."""

from __future__ import annotations

import pytest
import torch
import torch.utils.checkpoint
from torch._dynamo.utils import counters

import levers
from levers.levers._compile_setup import forward_called_directly
from levers.levers.lever import NotApplicable


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x)) + x


class _ByName(torch.nn.Module):
    """Calls each block's forward by name, as SqueezeBERT's encoder does."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(_Block() for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            x = layer.forward(x) * (i + 1)
        return x


class _ByIndex(_ByName):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i in range(len(self.layers)):
            x = self.layers[i].forward(x)
        return x


class _HandedOn(_ByName):
    """Hands each block's forward to a checkpoint: the module call is skipped all the same."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.utils.checkpoint.checkpoint(layer.forward, x, use_reentrant=False)
        return x


class _AsModules(_ByName):
    """Calls the blocks as modules, and some other module's forward by name (not a block)."""

    def __init__(self) -> None:
        super().__init__()
        self.head = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.head.forward(x)


class _Net(torch.nn.Module):
    def __init__(self, body: type[torch.nn.Module]) -> None:
        super().__init__()
        self.body = body()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x).sum()


def _compiled_frames(model: torch.nn.Module) -> int:
    """Graphs dynamo compiles for one forward and backward of ``model`` with compile-blocks'
    own compile, applied past its refusal."""
    torch._dynamo.reset()
    counters.clear()
    blocks = list(model.body.layers)
    for block in blocks:
        block.compile(backend="aot_eager")
    try:
        model(torch.randn(2, 8)).backward()
    finally:
        for block in blocks:
            vars(block).pop("_compiled_call_impl", None)
    return int(counters["stats"]["unique_graphs"])


@pytest.mark.parametrize("body", [_ByName, _ByIndex, _HandedOn])
def test_compile_blocks_refuses_blocks_called_by_forward_and_says_why(body):
    model = _Net(body)
    # the defect it guards against: module.compile() on such blocks compiles nothing
    assert _compiled_frames(model) == 0
    with pytest.raises(NotApplicable) as refused:
        levers.apply(model, "compile-blocks", backend="aot_eager")
    said = str(refused.value)
    assert f"{body.__name__}.forward calls its blocks' forward by name" in said
    assert ("layer.forward" if body is not _ByIndex else "self.layers[i].forward(...)") in said
    assert "use compile-model" in said
    assert all(vars(block).get("_compiled_call_impl") is None for block in model.body.layers)


def test_compile_blocks_still_applies_to_blocks_called_as_modules():
    model = _Net(_AsModules)
    assert _compiled_frames(model) >= 1
    assert forward_called_directly(model, list(model.body.layers)) is None
    handle = levers.apply(model, "compile-blocks", backend="aot_eager")
    assert all(block._compiled_call_impl is not None for block in model.body.layers)
    handle.undo()


def test_squeezebert_blocks_are_found_called_by_forward():
    """On transformers' SqueezeBERT as shipped (built from its config, random weights)."""
    transformers = pytest.importorskip("transformers")
    config = transformers.SqueezeBertConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, embedding_size=32, max_position_embeddings=16)
    model = transformers.SqueezeBertForMaskedLM(config)
    with pytest.raises(NotApplicable, match=r"SqueezeBertEncoder\.forward calls its blocks' "
                       r"forward by name \(layer\.forward\(\.\.\.\)\)"):
        levers.apply(model, "compile-blocks")
    bert = transformers.BertForMaskedLM(transformers.BertConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=16))
    assert forward_called_directly(bert, [b for b in bert.bert.encoder.layer]) is None
