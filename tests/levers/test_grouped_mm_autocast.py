"""grouped-mm-autocast on a Hugging Face mixture of experts and on experts written by hand: under
bf16 autocast the experts' grouped matmuls take bf16 operands instead of fp32 ones, the loss stays
within the lever's tolerance of the fp32 experts' and the gradients reach the fp32 weights; a
step without autocast is unchanged bit for bit; the undo puts transformers' function back and
removes the autocast rule."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

import levers  # noqa: E402
from levers.levers import load_all  # noqa: E402
from levers.levers.lever import NotApplicable  # noqa: E402
from levers.workloads import zoo  # noqa: E402

LEVER = load_all()["grouped-mm-autocast"]


class _GroupedDtypes(torch.utils._python_dispatch.TorchDispatchMode):
    """The operand dtypes of every grouped matmul, forward and backward."""

    def __init__(self) -> None:
        super().__init__()
        self.dtypes: list[tuple[torch.dtype, ...]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func._overloadpacket is torch.ops.aten._grouped_mm:
            self.dtypes.append(tuple(a.dtype for a in args[:2]))
        return func(*args, **(kwargs or {}))


def _step(model, batch, *, autocast: bool):
    model.zero_grad(set_to_none=True)
    with _GroupedDtypes() as seen, torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = model(**batch).loss
        loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters() if "experts" in n}
    return loss.detach().float(), grads, seen.dtypes


@pytest.fixture
def mixtral():
    model = zoo.build(model="mixtral").model
    torch.manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (2, 32))
    return model, {"input_ids": ids, "labels": ids}


def test_under_autocast_the_grouped_matmuls_run_in_bf16_and_the_loss_holds(mixtral):
    from transformers.integrations import moe

    model, batch = mixtral
    original = moe._grouped_mm
    loss_fp32, _, dtypes = _step(model, batch, autocast=True)
    assert dtypes and all(d == (torch.float32, torch.float32) for d in dtypes)  # the problem
    with levers.apply(model, "grouped-mm-autocast"):
        assert moe._grouped_mm is not original
        loss_bf16, grads, dtypes = _step(model, batch, autocast=True)
    assert moe._grouped_mm is original
    assert dtypes and all(d == (torch.bfloat16, torch.bfloat16) for d in dtypes)
    torch.testing.assert_close(loss_bf16, loss_fp32, rtol=LEVER.tolerance, atol=0)
    assert grads and all(g is not None and g.dtype == torch.float32 for g in grads.values())


def test_without_autocast_the_step_is_unchanged(mixtral):
    model, batch = mixtral
    loss_off, grads_off, _ = _step(model, batch, autocast=False)
    grads_off = {n: g.clone() for n, g in grads_off.items()}
    with levers.apply(model, "grouped-mm-autocast"):
        loss_on, grads_on, dtypes = _step(model, batch, autocast=False)
    assert all(d == (torch.float32, torch.float32) for d in dtypes)
    assert torch.equal(loss_on, loss_off)
    assert all(torch.equal(grads_on[n], g) for n, g in grads_off.items())


class _HandWritten(torch.nn.Module):
    """Experts as torchtitan writes them: one torch._grouped_mm over tokens sorted by expert."""

    def __init__(self) -> None:
        super().__init__()
        self.experts = torch.nn.Module()
        self.experts.w = torch.nn.Parameter(torch.randn(4, 32, 16) * 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        offs = torch.tensor([16, 32, 48, 64], dtype=torch.int32)
        return torch._grouped_mm(x, self.experts.w, offs=offs)


def test_experts_written_by_hand_get_autocast_s_rule_and_lose_it_on_undo():
    from levers.levers.grouped_mm_autocast import torch_autocasts_grouped_mm

    model, x = _HandWritten(), torch.randn(64, 32)

    def step():
        with _GroupedDtypes() as seen, torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(x)
        out.float().pow(2).sum().backward()  # a grad with real strides: _grouped_mm needs one
        return out.detach().float(), seen.dtypes

    assert not torch_autocasts_grouped_mm()
    fp32, dtypes = step()
    assert dtypes and all(d == (torch.float32, torch.float32) for d in dtypes)
    with levers.apply(model, "grouped-mm-autocast"):
        assert torch_autocasts_grouped_mm()
        bf16, dtypes = step()
        assert dtypes and all(d == (torch.bfloat16, torch.bfloat16) for d in dtypes)
        assert model.experts.w.grad.dtype == torch.float32
    assert not torch_autocasts_grouped_mm()
    torch.testing.assert_close(bf16, fp32, rtol=LEVER.tolerance, atol=1e-2)
    assert step()[1][0] == (torch.float32, torch.float32)


def test_it_says_why_it_does_not_apply():
    with pytest.raises(NotApplicable, match="no experts module"):
        levers.apply(torch.nn.Linear(4, 4), "grouped-mm-autocast")
    with pytest.raises(NotApplicable, match="no experts module"):
        levers.apply(zoo.build(model="llama").model, "grouped-mm-autocast")
    eager = zoo.build(model="mixtral").model
    eager.set_experts_implementation("eager")
    with pytest.raises(NotApplicable, match="cast by autocast already"):
        levers.apply(eager, "grouped-mm-autocast")
    with levers.apply(eager, ["experts-grouped-mm", "grouped-mm-autocast"]) as handle:
        assert handle.applied == ["experts-grouped-mm", "grouped-mm-autocast"]
    bf16 = zoo.build(model="mixtral", dtype="bfloat16").model
    with pytest.raises(NotApplicable, match="already torch.bfloat16"):
        levers.apply(bf16, "grouped-mm-autocast")
