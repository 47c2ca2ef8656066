"""channels-last: a convnet's convolution weights (and their gradients and optimizer state) in
NHWC, the activations following; parity with the NCHW step, refusals, an exact undo."""

from __future__ import annotations

import pytest
import torch

import levers
from levers.levers import load_all
from levers.levers.lever import NotApplicable, Target
from levers.workload import Workload

from lever_parity import assert_close, assert_restored, run_steps, state_of

REGISTRY = load_all()
CL = torch.channels_last


class ConvNet(torch.nn.Module):
    def __init__(self, convolutions: int = 3) -> None:
        super().__init__()
        layers = []
        for i in range(convolutions):
            layers += [torch.nn.Conv2d(3 if i == 0 else 8, 8, 3, padding=1, bias=False),
                       torch.nn.BatchNorm2d(8), torch.nn.ReLU()]
        self.features = torch.nn.Sequential(*layers)
        self.head = torch.nn.Linear(8, 5)
        self.seen: list[torch.Tensor] = []

    def forward(self, x):
        x = self.features(x)
        self.seen = [x]
        return self.head(x.mean((2, 3)))


def convnet_workload(convolutions: int = 3, seed: int = 0) -> Workload:
    torch.manual_seed(seed)
    model = ConvNet(convolutions)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=True)
    generator = torch.Generator().manual_seed(1)
    images = torch.randn(4, 3, 12, 12, generator=generator)
    labels = torch.randint(0, 5, (4,), generator=generator)

    def step():
        optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        return loss.detach()

    return Workload(model=model, step=step, optimizer=optimizer, tokens_per_step=4,
                    device=torch.device("cpu"))


def conv_weights(model):
    return [m.weight for m in model.modules() if isinstance(m, torch.nn.Conv2d)]


def test_the_weights_state_and_activations_go_channels_last_and_the_steps_keep_parity():
    baseline, candidate = convnet_workload(), convnet_workload()
    baseline.step(), candidate.step()  # the optimizer holds state before the lever
    expected = run_steps(baseline, 3)
    weights = conv_weights(candidate.model)
    handle = levers.apply(candidate, "channels-last")
    assert handle.applied == ["channels-last"]
    state = candidate.optimizer.state
    for weight in weights:
        assert weight.is_contiguous(memory_format=CL) and not weight.is_contiguous()
        assert state[weight]["exp_avg"].is_contiguous(memory_format=CL)
        assert state[weight]["exp_avg_sq"].is_contiguous(memory_format=CL)
    assert all(w is p for w, p in zip(weights, conv_weights(candidate.model)))  # same Parameters
    got = run_steps(candidate, 3)
    assert candidate.model.seen[0].is_contiguous(memory_format=CL)  # the activations follow
    assert all(w.grad.is_contiguous(memory_format=CL) for w in weights)
    assert_close(got, expected, REGISTRY["channels-last"].tolerance)
    handle.undo()
    for weight in weights:
        assert weight.is_contiguous()
        assert state[weight]["exp_avg"].is_contiguous()
    candidate.step()
    assert candidate.model.seen[0].is_contiguous()


def test_the_undo_gives_back_the_values_and_the_layout_it_found():
    workload = convnet_workload()
    before = state_of(workload.model)
    strides = [w.stride() for w in conv_weights(workload.model)]
    levers.apply(workload, "channels-last").undo()
    assert_restored(workload.model, before)
    assert [w.stride() for w in conv_weights(workload.model)] == strides


def test_it_is_refused_where_it_has_nothing_to_do_or_would_be_undone_by_a_compiled_program():
    lever = REGISTRY["channels-last"]
    assert "1 2-D convolution in the model" in lever.applies(Target(model=ConvNet(1)))
    assert "0 2-D convolutions" in lever.applies(Target(model=torch.nn.Linear(2, 2)))
    model = ConvNet()
    model.to(memory_format=CL)
    assert "channels-last already" in lever.applies(Target(model=model))
    compiled = ConvNet()
    compiled.features[0].compile(backend="eager")
    reason = lever.applies(Target(model=compiled))
    assert "compiled already" in reason and "before compile-model" in reason
    with pytest.raises(NotApplicable, match="compiled already"):
        levers.apply(compiled, "channels-last")


def test_a_stack_applies_it_before_the_compile_that_traces_its_layout():
    workload = convnet_workload()
    handle = levers.apply(workload, ["compile-model", "channels-last"], backend="eager")
    try:
        assert handle.applied == ["channels-last", "compile-model"]
        workload.step()
        assert workload.model.seen[0].is_contiguous(memory_format=CL)
    finally:
        handle.undo()
        torch._dynamo.reset()
    assert all(w.is_contiguous() for w in conv_weights(workload.model))
