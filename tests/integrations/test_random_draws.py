"""Whether a model's forward draws random numbers, as the probe of ``levers tune -- python
train.py`` sees it: the default generators' state around each forward of the model."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from levers.integrations.random_draws import ForwardDraws


class Attention(torch.nn.Module):
    def __init__(self, dropout_p: float) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)
        self.dropout_p = dropout_p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.proj(x).view(1, 1, 4, 8)
        p = self.dropout_p if self.training else 0.0
        return F.scaled_dot_product_attention(q, q, q, dropout_p=p).view(4, 8)


class Functional(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.dropout(self.fc(x), p=0.2, training=self.training)


def _draws(model: torch.nn.Module, *, batches_drawn: bool = False) -> bool | None:
    with ForwardDraws(model) as draws:
        for _ in range(2):
            x = torch.randn(4, 8) if batches_drawn else torch.ones(4, 8)
            model(x).sum().backward()
    return draws.drew


def test_attention_s_dropout_and_a_functional_dropout_are_draws():
    assert _draws(Attention(0.1)) is True
    assert _draws(Functional()) is True


def test_no_dropout_and_batches_drawn_outside_the_forward_are_not():
    assert _draws(Attention(0.0), batches_drawn=True) is False
    assert _draws(Functional().eval()) is False


def test_no_forward_seen_is_not_known_and_the_hooks_are_removed():
    model = Functional()
    with ForwardDraws(model) as draws:
        pass
    assert draws.drew is None
    assert not model._forward_pre_hooks and not model._forward_hooks
