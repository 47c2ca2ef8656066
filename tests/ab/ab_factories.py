"""Tiny workload factories for the ab tests: a residual MLP and ways to get its "fix" wrong.

``fixed`` picks the candidate's implementation:

- "none": the reference step;
- "rewrite": the same math written differently (explicit matmuls instead of nn.Linear calls):
  a correct, numerics-changing fix;
- "scaled_loss": silently doubles the loss (a wrong fix);
- "no_residual": silently drops the residual connection (a wrong fix);
- "leaky": scales the output by 2 and sets ``LEAKED_SCALE`` so that every model built after it
  does too (a wrong fix that patches something global; the tests put it back).

``transient_bytes`` allocates that much scratch for the duration of each step and
``resident_bytes`` keeps that much in a model buffer (memory attribution tests on a GPU).
``spin_cycles`` keeps the GPU busy that many clock cycles in each step (``torch.cuda._sleep``): a
slower side on a GPU whose numbers are the reference's. ``unseeded`` adds noise drawn from the OS's entropy to each step's input (a model that reseeds
from the OS: it never repeats itself). ``nan_at`` makes the loss NaN from that step on (1-based); ``raise_at`` makes the step raise.
``clock`` (a one-element list, seconds) makes every step advance a fake clock by ``step_ms``
times (1 + ``noise`` * a standard normal draw from ``random.Random(noise_seed)``): timing tests
are then deterministic.
"""

from __future__ import annotations

import random
import time

import torch
import torch.nn.functional as F

from levers import Workload

FIXES = ("none", "rewrite", "scaled_loss", "no_residual", "leaky")
LEAKED_SCALE = [1.0]  # read by every build; "leaky" sets it


class ResidualMLP(torch.nn.Module):
    def __init__(self, dim: int, fixed: str) -> None:
        super().__init__()
        self.up = torch.nn.Linear(dim, 4 * dim)
        self.down = torch.nn.Linear(4 * dim, dim)
        self.head = torch.nn.Linear(dim, 1)
        self.fixed = fixed
        self.scale = LEAKED_SCALE[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fixed == "rewrite":
            h = torch.relu(x @ self.up.weight.t() + self.up.bias)
            h = x + (h @ self.down.weight.t() + self.down.bias)
            return h @ self.head.weight.t() + self.head.bias
        h = self.down(torch.relu(self.up(x)))
        h = h if self.fixed == "no_residual" else x + h
        return self.head(h) * self.scale


def _returned(returns, loss, x):
    """What step() hands back: the loss alone, or the shapes training code often returns."""
    if returns == "tuple":
        return x.detach(), loss  # the loss is the first scalar tensor, not the first item
    if returns == "dict":
        return {"logits": x.detach(), "loss": loss}
    if returns == "logits_only":
        return {"logits": x.detach()}
    return loss


def build(
    seed=0,
    fixed="none",
    dim=16,
    batch_size=8,
    device="cpu",
    nan_at=None,
    raise_at=None,
    clock=None,
    step_ms=1.0,
    noise=0.0,
    noise_seed=0,
    tokens_per_step=None,
    transient_bytes=0,
    resident_bytes=0,
    returns="loss",
    interrupt_at=None,
    unseeded=False,
    spin_cycles=0,
    stall_at=None,
    stall_s=0.0,
):
    if fixed not in FIXES:
        raise ValueError(f"fixed must be one of {FIXES}, got {fixed!r}")
    torch.manual_seed(seed)
    if fixed == "leaky":
        LEAKED_SCALE[0] = 2.0
    model = ResidualMLP(dim, fixed).to(device)
    if resident_bytes:
        model.register_buffer(
            "ballast", torch.zeros(resident_bytes, dtype=torch.uint8, device=device)
        )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(batch_size, dim, generator=generator).to(device)
    y = torch.randn(batch_size, 1, generator=generator).to(device)
    num_steps = [0]
    noise_rng = random.Random(noise_seed)

    def step():
        num_steps[0] += 1
        if raise_at is not None and num_steps[0] >= raise_at:
            raise RuntimeError("boom in the user's step")
        if interrupt_at is not None and num_steps[0] >= interrupt_at:
            raise KeyboardInterrupt
        if stall_at is not None and num_steps[0] == stall_at:
            time.sleep(stall_s)  # one long step in real time, as a first compile is
        scratch = torch.ones(transient_bytes, dtype=torch.uint8, device=device)
        inputs = x
        if unseeded:
            entropy = torch.Generator().manual_seed(random.SystemRandom().randrange(2**62))
            inputs = x + 1e-2 * torch.randn(x.shape, generator=entropy).to(device)
        loss = F.mse_loss(model(inputs), y) + 0 * scratch[:1].sum()
        if fixed == "scaled_loss":
            loss = loss * 2
        if nan_at is not None and num_steps[0] >= nan_at:
            loss = loss * float("nan")
        loss.backward()
        if spin_cycles:
            torch.cuda._sleep(spin_cycles)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del scratch
        if clock is not None:
            clock[0] += step_ms * (1.0 + noise * noise_rng.gauss(0.0, 1.0)) / 1e3
        return _returned(returns, loss, x)

    return Workload(
        model=model,
        step=step,
        optimizer=optimizer,
        tokens_per_step=tokens_per_step or batch_size,
        name=f"mlp-{fixed}",
        params={"seed": seed, "fixed": fixed, "dim": dim, "batch_size": batch_size},
    )
