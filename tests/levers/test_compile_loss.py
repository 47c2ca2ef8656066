"""compile-loss on a Hugging Face causal LM: the model's loss runs compiled (dynamo captures it,
training is the eager step's to rounding), the undo gives the model transformers' loss back, a
re-apply reuses what was compiled, and the models it cannot help are refused with why."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

pytest.importorskip("transformers")

import levers  # noqa: E402
from levers.levers import load_all  # noqa: E402
from levers.levers.lever import Target  # noqa: E402

BACKEND = "compile-loss:backend=aot_eager"


def _workload(model: str = "llama"):
    torch.manual_seed(0)
    return levers.Step("zoo", params={"model": model}).workload()


def _losses_and_params(lever: str | None, steps: int = 3):
    workload = _workload()
    handle = levers.apply(workload, [lever]) if lever else None
    losses = [float(workload.step()) for _ in range(steps)]
    params = [p.detach().clone() for p in workload.model.parameters()]
    return workload, handle, losses, params


def test_the_loss_runs_compiled_and_training_is_unchanged():
    torch._dynamo.reset()
    counters.clear()
    _, _, plain_losses, plain_params = _losses_and_params(None)
    assert counters["frames"]["ok"] == 0
    workload, handle, losses, params = _losses_and_params(BACKEND)
    # the loss function is the only frame compiled: the model's forward stays eager
    assert counters["frames"]["ok"] >= 1
    assert vars(workload.model)["_loss_function"]._torchdynamo_orig_callable.__name__ == (
        "ForCausalLMLoss")
    assert losses == pytest.approx(plain_losses, rel=1e-5)
    for before, after in zip(plain_params, params):
        torch.testing.assert_close(after, before, rtol=1e-5, atol=1e-6)
    handle.undo()
    assert "_loss_function" not in vars(workload.model)
    assert workload.model.loss_function.__name__ == "ForCausalLMLoss"


def test_applied_again_after_its_undo_it_compiles_nothing_new():
    torch._dynamo.reset()
    counters.clear()
    workload = _workload()
    compiled = []
    for _ in range(3):
        handle = levers.apply(workload, [BACKEND])
        workload.step()
        compiled.append(counters["frames"]["ok"])
        handle.undo()
        workload.step()
    assert compiled[0] >= 1
    assert compiled[1] == compiled[2] == compiled[0]


def _why_not(workload) -> str | None:
    return load_all()["compile-loss"].applies(Target(model=workload.model))


def test_refused_where_it_cannot_help_with_why():
    # BERT's masked LM calls CrossEntropyLoss itself
    assert "self.loss_function" in _why_not(_workload("bert"))
    # a model that is not transformers'
    assert "not a Hugging Face model" in _why_not(_workload("nanogpt"))
    llama = _workload()
    llama.model._loss_function = lambda *a, **k: None  # set by the user's code
    assert "set already" in _why_not(llama)
    whole = _workload()
    whole.model.compile(backend="aot_eager")
    assert "compile-model" in _why_not(whole)


def test_an_image_classifier_loss_is_not_its_regime():
    assert "not a language model's cross-entropy" in _why_not(_workload("vit"))
