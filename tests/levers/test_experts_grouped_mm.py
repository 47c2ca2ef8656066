"""experts-grouped-mm on a Hugging Face mixture of experts (issue 22): applies where the experts
loop (experts_implementation="eager"), gives the loop's losses and gradients within its
tolerance in fp32 on a CPU, and the undo puts the loop back."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

import levers  # noqa: E402
from levers.levers import load_all  # noqa: E402
from levers.levers.lever import NotApplicable  # noqa: E402
from levers.workloads import zoo  # noqa: E402

LEVER = load_all()["experts-grouped-mm"]


class _GroupedCalls(torch.utils._python_dispatch.TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls += func._overloadpacket is torch.ops.aten._grouped_mm
        return func(*args, **(kwargs or {}))


def _loss_and_grads(model, batch):
    model.zero_grad(set_to_none=True)
    with _GroupedCalls() as counted:
        loss = model(**batch).loss
        loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), grads, counted.calls


def test_grouped_matmuls_give_the_expert_loop_s_loss_and_gradients_and_undo_restores_it():
    workload = zoo.build(model="mixtral")
    model = workload.model
    model.set_experts_implementation("eager")
    torch.manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (2, 32))
    batch = {"input_ids": ids, "labels": ids}
    loss_loop, grads_loop, grouped_in_loop = _loss_and_grads(model, batch)
    assert grouped_in_loop == 0  # one matmul per expert
    with levers.apply(model, "experts-grouped-mm"):
        assert model.config._experts_implementation == "grouped_mm"
        loss_grouped, grads_grouped, grouped_calls = _loss_and_grads(model, batch)
        assert grouped_calls > 0
    assert model.config._experts_implementation == "eager"
    torch.testing.assert_close(loss_grouped, loss_loop, rtol=LEVER.tolerance, atol=0)
    assert grads_grouped.keys() == grads_loop.keys()
    for name, grad in grads_loop.items():
        torch.testing.assert_close(grads_grouped[name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_it_says_why_it_does_not_apply():
    with pytest.raises(NotApplicable, match="already run as grouped matmuls"):
        levers.apply(zoo.build(model="mixtral").model, "experts-grouped-mm")  # the default
    with pytest.raises(NotApplicable, match="no experts module"):
        levers.apply(zoo.build(model="llama").model, "experts-grouped-mm")
    with pytest.raises(NotApplicable, match="not a Hugging Face model"):
        levers.apply(torch.nn.Linear(4, 4), "experts-grouped-mm")
