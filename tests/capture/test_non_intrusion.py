"""A captured step trains exactly like an uncaptured one: bitwise-equal parameters and state.
A two-pass capture runs two steps (the recorded one and the timed one), both like plain steps."""

from __future__ import annotations

import importlib

import pytest
import torch

import fixture_models
from levers.capture import capture_step
from levers.capture.step import MODES, capture_mode
from levers.workload import Workload


def _state(workload: Workload) -> dict[str, torch.Tensor]:
    state = {f"param:{n}": p.detach().clone() for n, p in workload.model.named_parameters()}
    state.update({f"buffer:{n}": b.detach().clone() for n, b in workload.model.named_buffers()})
    if workload.optimizer is not None:
        for i, (param, s) in enumerate(workload.optimizer.state.items()):
            for key, value in s.items():
                if isinstance(value, torch.Tensor):
                    state[f"opt:{i}:{key}"] = value.detach().clone()
    return state


def assert_capture_does_not_change_training(
    build, num_warmup: int = 1, mode: str | None = None
) -> None:
    plain, captured = build(), build()
    for _ in range(num_warmup):
        plain.step()
    plain.step()  # the same step the capture records
    if capture_mode(mode) == "two-pass":
        plain.step()  # the step the capture times
    capture_step(captured, warmup=num_warmup, timed=0, mode=mode)
    a, b = _state(plain), _state(captured)
    assert a.keys() == b.keys() and len(a) > 0
    for key in a:
        assert torch.equal(a[key], b[key]), f"{key} differs after a captured step"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("checkpointing", [False, True])
@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_fixture_model_trains_identically(checkpointing, optimizer, mode):
    assert_capture_does_not_change_training(
        lambda: fixture_models.net(checkpointing=checkpointing, optimizer=optimizer), mode=mode
    )


def _builtin(name: str, **params):
    module = importlib.import_module(f"levers.workloads.{name}")
    return lambda: module.build(**params)


@pytest.mark.parametrize(
    "name, params",
    [
        ("demo", {}),
        ("demo", {"fixed": "all"}),
        ("llama", {}),
        ("hf", {"arch": "llama", "attn": "eager"}),
        ("hf", {"arch": "gemma", "attn": "sdpa"}),
    ],
)
def test_builtin_workloads_train_identically(name, params):
    if name == "hf":
        pytest.importorskip("transformers")
    assert_capture_does_not_change_training(_builtin(name, **params))
