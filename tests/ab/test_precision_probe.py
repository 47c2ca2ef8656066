"""The autocast probe of the parity steps reads a compiled model without being compiled into it.

A hook that dynamo traces is guarded on: removing it after the parity steps made every compiled
program compile again for the timed steps (30 s of a llama's A/B on the H200).
"""

from __future__ import annotations

import torch
from torch._dynamo.testing import CompileCounter

from levers.ab.precision import autocast_probe


class _Block(torch.nn.Module):
    # a class of the test's own: dynamo does not compile a frame of torch's own modules
    # (an nn.Sequential of torch's layers) when it is the top of the program
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x).relu()


class _Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = _Block(), _Block()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(self.first(x))


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return _Model()


def _forward_under_autocast(model: torch.nn.Module) -> None:
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(torch.ones(4, 8))


def test_a_compiled_model_s_autocast_is_seen_and_nothing_compiles_again_after_the_probe():
    torch._dynamo.reset()
    model = _model()
    counter = CompileCounter()
    model.compile(backend=counter)
    with autocast_probe(model, "cpu") as seen:
        _forward_under_autocast(model)
        _forward_under_autocast(model)
    assert seen() == torch.bfloat16
    frames = counter.frame_count
    assert frames >= 1
    _forward_under_autocast(model)
    assert counter.frame_count == frames  # the program made under the probe still serves
    assert model._compiled_call_impl is not None and not model._forward_pre_hooks


def test_compiled_blocks_are_read_where_they_are_called_and_the_model_s_own_call_decides():
    torch._dynamo.reset()
    model = _model()
    counter = CompileCounter()
    model.first.compile(backend=counter)
    with autocast_probe(model, "cpu") as seen:
        model(torch.ones(4, 8))  # autocast off: the model's own forward decides
        _forward_under_autocast(model.first)
    assert seen() is None
    frames = counter.frame_count
    model(torch.ones(4, 8))
    assert counter.frame_count == frames
    assert all(not m._forward_pre_hooks for m in model.modules())


def test_a_step_that_calls_only_a_compiled_part_is_read_from_that_part():
    torch._dynamo.reset()
    model = _model()
    model.second.compile(backend=CompileCounter())
    with autocast_probe(model, "cpu") as seen:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            model.second(torch.ones(4, 8))
    assert seen() == torch.bfloat16


def test_an_eager_model_is_read_as_before():
    model = _model()
    with autocast_probe(model, "cpu") as seen:
        _forward_under_autocast(model)
    assert seen() == torch.bfloat16
    assert all(not m._forward_pre_hooks for m in model.modules())
