"""COPY001 fixtures: a clone made only to scatter into, a large cat, and copies that are fine."""

# fmt: off
# (the cases are laid out by hand: tests find the lines marked `# mark: <case>`)

import torch

from levers import Workload


class Embed(torch.nn.Module):
    def __init__(self, clone=True, of_parameter=False):
        super().__init__()
        self.embed = torch.nn.Embedding(64, 32)
        self.proj = torch.nn.Linear(16, 32)
        self.clone, self.of_parameter = clone, of_parameter

    def forward(self, ids, feats):
        rows = torch.arange(4)
        if self.of_parameter:
            table = self.embed.weight.clone()  # a leaf: the clone protects the parameter
            table[rows] = self.proj(feats)
            return table[ids]
        x = self.embed(ids)
        if self.clone:
            x = x.clone()  # mark: fire_clone_then_scatter
        x[0, rows] = self.proj(feats)
        return x


class BigCat(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 4096)
        self.b = torch.nn.Linear(8, 4096)

    def forward(self, x):
        return torch.cat([self.a(x), self.b(x)], dim=0)  # mark: fire_large_cat


class Reshape(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(32, 32)

    def forward(self, x):
        # transpose + reshape copies inside PyTorch; not a user-level copy
        return self.fc(x.transpose(1, 2).reshape(x.shape[0], -1, 32))


def _workload(model, inputs):
    torch.manual_seed(0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step():
        model(*inputs).float().pow(2).mean().backward()
        opt.step()
        opt.zero_grad()

    return Workload(model=model, step=step, optimizer=opt, name="copy001")


def _ids():
    return (torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0)), torch.randn(4, 16))


def fire_clone_then_scatter():
    torch.manual_seed(0)
    return _workload(Embed(), _ids())


def fire_large_cat():
    torch.manual_seed(0)
    return _workload(BigCat(), (torch.randn(2048, 8),))


def ok_scatter_in_place():
    torch.manual_seed(0)
    return _workload(Embed(clone=False), _ids())


def ok_reshape_copy():
    torch.manual_seed(0)
    return _workload(Reshape(), (torch.randn(2, 32, 8),))


def regress_clone_of_parameter():
    torch.manual_seed(0)
    return _workload(Embed(of_parameter=True), _ids())
