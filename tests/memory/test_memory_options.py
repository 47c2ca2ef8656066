"""One prediction's options are one record, checked at the border and passed whole (issue 35)."""

from __future__ import annotations

import memory_factories as factories
import pytest

import levers.hardware
from levers import Step
from levers.hardware import GPUS
from levers.memory import predict_memory
from levers.memory.options import MemoryOptions


def never_built(device: str = "cpu"):
    raise AssertionError("the workload was built before the options were checked")


def test_the_record_resolves_the_gpu_and_checks_every_value():
    options = MemoryOptions.checked(gpu="h200", margin=0.1, num_steps=2, world_size=4)
    assert options.gpu is GPUS["h200"] and (options.margin, options.num_steps) == (0.1, 2)
    assert (options.world_size, options.strategy) == (4, "ddp")  # ddp unless told
    assert MemoryOptions.checked() == MemoryOptions()  # the defaults are declared once
    assert MemoryOptions.checked(gpu="40GiB").gpu.name == "40GiB"  # a budget, as --gpu takes
    for given, said in [
        ({"gpu": "h900"}, "--gpu 'h900' is not a known GPU or a memory budget"),
        ({"margin": 1.5}, r"margin must be in \[0, 1\)"),
        ({"num_steps": 0}, "--predict-steps must be at least 1, got 0"),
        ({"world_size": 0}, "--world-size must be at least 1, got 0"),
        ({"world_size": 2, "strategy": "zero3"}, "--strategy 'zero3' is not known"),
        ({"strategy": "zero1"}, "--strategy needs --world-size N"),
    ]:
        with pytest.raises(ValueError, match=said):
            MemoryOptions.checked(**given)


def test_a_bad_option_is_refused_before_the_workload_is_built():
    step = Step(never_built)
    for call, said in [
        (lambda: step.memory(margin=1.5), "margin must be in"),
        (lambda: step.memory(world_size=2, strategy="zero3"), "is not known"),
        (lambda: step.memory(world_size=2, lever_ids=["ac-full"]), "leave out world_size"),
        (lambda: step.fit(num_steps=0), "--predict-steps must be at least 1"),
        (lambda: step.fit(options=MemoryOptions(world_size=2, strategy="ddp")), "one rank's"),
        (lambda: predict_memory(never_built, "h900"), "--gpu 'h900' is not a known GPU"),
    ]:
        with pytest.raises(ValueError, match=said):
            call()


def test_the_gpu_name_is_looked_up_once_per_prediction(monkeypatch):
    seen = []
    lookup = levers.hardware.lookup_gpu

    def counted(text):
        seen.append(text)
        return lookup(text)

    monkeypatch.setattr(levers.hardware, "lookup_gpu", counted)
    step = Step(factories.mlp)
    # the what-ifs and each rank's peak re-predict the step on the GPU resolved once
    plan = step.memory(gpu="a100", num_steps=1, whatifs=True, world_size=2)
    assert seen == ["a100"] and plan.gpu is GPUS["a100-80gb"] and "per_rank" in plan.extra
    seen.clear()
    step.fit(gpu="0.6GiB", num_steps=1)  # a budget: looked up once, then read as a size
    assert seen == ["0.6GiB"]
    seen.clear()
    predict_memory(factories.mlp, "h200", num_steps=1)
    assert seen == ["h200"]
    seen.clear()
    # the audit's GPU is the memory model's: resolved once for both
    step.audit(target="h200", select=["MEM001"], benchmark=False, measure=False)
    assert seen == ["h200"]


def test_one_record_is_one_plan():
    step = Step(factories.mlp)
    plan = step.memory(gpu="h100", num_steps=1)
    # the part's other name, and the record itself, are the same options: the plan is kept
    assert step.memory(gpu="h100-80gb", num_steps=1) is plan
    assert step.memory(options=MemoryOptions(num_steps=1)) is plan


def test_step_memory_fit_and_predict_memory_take_the_record_or_the_keywords_not_both():
    step = Step(never_built)
    options = MemoryOptions.checked(gpu="a100")
    for call in (
        lambda: step.memory(options=options, gpu="h200"),
        lambda: step.memory(options=options, whatifs=True),
        lambda: step.fit(options=options, margin=0.1),
        lambda: predict_memory(never_built, "h200", options=options),
    ):
        with pytest.raises(TypeError, match="not both"):
            call()
