"""The model found from the optimizer's parameters (levers.integrations.steps.find_model)."""

from __future__ import annotations

import pytest
import torch

from levers.integrations.steps import find_model

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("arch", ["opt", "bloom", "gpt2"])
def test_a_weight_tied_language_model_is_found_whole_not_its_body(arch):
    # the head shares the embedding's weight, so the body holds the same set of parameters: the
    # model is the one that holds the tied weight at both of its places (defect N5)
    config = transformers.AutoConfig.for_model(
        arch, vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        ffn_dim=32, word_embed_proj_dim=16, n_embd=16, n_layer=1, n_head=2, n_positions=32,
        max_position_embeddings=32,
    )
    model = transformers.AutoModelForCausalLM.from_config(config)
    assert model.config.tie_word_embeddings
    optimizer = torch.optim.AdamW(model.parameters())
    assert find_model(optimizer) is model


def test_a_wrapper_around_one_model_still_gives_the_inner_model():
    inner = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
    wrapper = torch.nn.ModuleDict({"module": inner})
    optimizer = torch.optim.SGD(wrapper.parameters(), lr=0.1)
    assert find_model(optimizer) is inner


def test_a_tied_module_with_no_extra_place_ties_as_before():
    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(8, 4)
            self.head = torch.nn.Linear(4, 8, bias=False)
            self.head.weight = self.embed.weight

    model = Tied()
    wrapper = torch.nn.ModuleDict({"module": model})  # the same places, one more module
    optimizer = torch.optim.SGD(wrapper.parameters(), lr=0.1)
    assert find_model(optimizer) is model


class _Net(torch.nn.Module):
    """A model that computes its loss around a backbone holding every parameter."""

    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))

    def forward(self, x):
        return self.body(x).square().mean()


def test_the_outermost_called_module_is_the_model_when_it_holds_no_parameter_of_its_own():
    from levers.integrations.steps import forward_calls

    net = _Net()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    assert find_model(optimizer) is net.body  # without the calls: the smaller one, as before
    with forward_calls() as called:
        net(torch.ones(2, 4)).backward()
    assert find_model(optimizer, called=called) is net


def test_a_called_wrapper_still_gives_the_model_inside_it():
    from levers.integrations.steps import forward_calls

    net = _Net()
    compiled = torch.compile(net, backend="eager")  # an OptimizedModule around net
    optimizer = torch.optim.SGD(compiled.parameters(), lr=0.1)
    with forward_calls() as called:
        compiled(torch.ones(2, 4)).backward()
    assert find_model(optimizer, called=called) is net
