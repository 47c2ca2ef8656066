"""The ``sdpa-attention`` what-if: timm's ``fused_attn`` switch, and a model with no switch."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from memory_factories import mlp
from torch import nn

from levers.memory import predict_memory
from levers.workload import Workload

DIM, HEADS, TOKENS, BATCH = 32, 2, 64, 4


class TimmStyleAttention(nn.Module):
    def __init__(self, fused: bool) -> None:
        super().__init__()
        self.fused_attn = fused  # timm's switch: SDPA when True, explicit softmax when False
        self.qkv = nn.Linear(DIM, 3 * DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, HEADS, c // HEADS).permute(2, 0, 3, 1, 4).unbind(0)
        if self.fused_attn:
            out = F.scaled_dot_product_attention(q, k, v)
        else:
            out = (q @ k.transpose(-2, -1) * (c // HEADS) ** -0.5).softmax(-1) @ v
        return out.transpose(1, 2).reshape(b, n, c)


def attention_model(device: str = "cpu", fused: bool = False) -> Workload:
    torch.manual_seed(0)
    model = nn.Sequential(TimmStyleAttention(fused), TimmStyleAttention(fused)).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)

    def step() -> torch.Tensor:
        x = torch.randn(BATCH, TOKENS, DIM, device=device)
        loss = model(x).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    return Workload(model=model, step=step, optimizer=optimizer, name="attention")


def sdpa_whatif(plan):
    (whatif,) = [w for w in plan.whatifs if w.name == "sdpa-attention"]
    return whatif


def test_fused_attn_switch_predicts_the_sdpa_model():
    eager = predict_memory(attention_model, "h100-80gb", whatifs=True)
    fused = predict_memory(attention_model, "h100-80gb", params={"fused": True})
    whatif = sdpa_whatif(eager)
    assert whatif.applicable
    assert whatif.method == "re-prediction with fused_attn=True on 2 modules"
    assert whatif.peak_allocated_bytes == fused.peak_allocated_bytes
    assert whatif.delta_allocated_bytes == fused.peak_allocated_bytes - eager.peak_allocated_bytes
    assert whatif.delta_allocated_bytes < 0


def test_a_model_without_a_switch_is_not_applicable():
    whatif = sdpa_whatif(predict_memory(mlp, "h100-80gb", whatifs=True))
    assert not whatif.applicable
    assert whatif.note.startswith("no eager attention with a switch to SDPA")
    # an already-fused model has nothing to switch either
    whatif = sdpa_whatif(
        predict_memory(attention_model, "h100-80gb", params={"fused": True}, whatifs=True)
    )
    assert not whatif.applicable
