"""NORM001 fixtures: norms written as elementwise chains, fused norms, and reductions that are
not norms."""

# fmt: off
# (the cases are laid out by hand: tests find the lines marked `# mark: <case>`)

import torch
import torch.nn.functional as F

from levers import Workload


class HandRMSNorm(torch.nn.Module):
    def __init__(self, width=32, eps=1e-6):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x):
        x32 = x.float()
        variance = x32.pow(2).mean(-1, keepdim=True)  # mark: fire_rms_norm
        return self.weight * (x32 * torch.rsqrt(variance + self.eps)).to(x.dtype)


class HandLayerNorm(torch.nn.Module):
    def __init__(self, width=32, eps=1e-5):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(width))
        self.bias = torch.nn.Parameter(torch.zeros(width))
        self.eps = eps

    def forward(self, x):
        mean = x.mean(-1, keepdim=True)  # mark: fire_layer_norm
        var = (x - mean).pow(2).mean(-1, keepdim=True)
        return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias


class FusedRMSNorm(HandRMSNorm):
    def forward(self, x):
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


class MeanPool(torch.nn.Module):
    """Averages over the sequence: a keepdim mean, but of dim 1 and with no rsqrt after it."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(32, 32)

    def forward(self, x):
        return self.proj(x) - self.proj(x).mean(1, keepdim=True)


class Blocks(torch.nn.Module):
    def __init__(self, norm, n=3):
        super().__init__()
        self.norms = torch.nn.ModuleList(norm() for _ in range(n))
        self.fcs = torch.nn.ModuleList(torch.nn.Linear(32, 32) for _ in range(n))

    def forward(self, x):
        for norm, fc in zip(self.norms, self.fcs):
            x = x + fc(norm(x))
        return x


def _workload(model):
    torch.manual_seed(0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(2, 8, 32)

    def step():
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()

    return Workload(model=model, step=step, optimizer=opt, name="norm001")


def fire_rms_norm():
    torch.manual_seed(0)
    return _workload(Blocks(HandRMSNorm))


def fire_layer_norm():
    return _workload(Blocks(HandLayerNorm, n=2))


def ok_fused_rms_norm():
    return _workload(Blocks(FusedRMSNorm))


def ok_nn_layer_norm():
    return _workload(Blocks(lambda: torch.nn.LayerNorm(32)))


def ok_mean_pool():
    return _workload(MeanPool())
