"""ELEM001 fixtures: repeated blocks whose step is mostly small elementwise kernels, and a step
that is one large matmul."""

# fmt: off
# (the cases are laid out by hand: tests find the lines marked `# mark: <case>`)

import torch
import torch.nn.functional as F

from levers import Workload


class Block(torch.nn.Module):
    def __init__(self, width=32):
        super().__init__()
        self.fc = torch.nn.Linear(width, width)
        self.scale = torch.nn.Parameter(torch.ones(width))

    def forward(self, x):
        h = F.gelu(self.fc(x)) * self.scale + x * 0.5 - x.sigmoid() * x.tanh()  # mark: fire_elementwise_blocks fire_blocks_with_a_batch_assembled_outside_the_model
        return h + x


class Net(torch.nn.Module):
    def __init__(self, n=3):
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block() for _ in range(n))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def fire_elementwise_blocks():
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 16, 32)

    def step():
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()

    return Workload(model=model, step=step, optimizer=opt, name="elem001")


def ok_one_large_matmul():
    torch.manual_seed(0)
    model = torch.nn.Linear(2048, 2048, bias=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(2048, 2048)

    def step():
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()

    return Workload(model=model, step=step, optimizer=opt, name="elem001")


class Flat(torch.nn.Module):
    """Elementwise work in one module with no numbered blocks: nothing for compile-blocks."""

    def __init__(self, width=32):
        super().__init__()
        self.fc = torch.nn.Linear(width, width)
        self.scale = torch.nn.Parameter(torch.ones(width))

    def forward(self, x):
        h = F.gelu(self.fc(x)) * self.scale + x * 0.5 - x.sigmoid() * x.tanh()
        return h * h.sigmoid() + x.tanh() * 0.25 - x.exp() * 0.01


def ok_no_repeated_blocks():
    torch.manual_seed(0)
    model = Flat()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 16, 32)

    def step():
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()

    return Workload(model=model, step=step, optimizer=opt, name="elem001")


def fire_blocks_with_a_batch_assembled_outside_the_model():
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    raw = torch.randn(64, 16, 32)

    def step():
        # host-side batch assembly, much elementwise work outside the model's modules
        x = ((raw * 0.5 + 1.0).clamp(-2, 2) - raw.mean() * raw.sigmoid()).tanh()[:4]  # mark: assembly
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()

    return Workload(model=model, step=step, optimizer=opt, name="elem001")


class NormedBlock(torch.nn.Module):
    """A block whose LayerNorm is written by hand (NORM001's pattern) or called fused, with
    elementwise work of its own after it."""

    def __init__(self, width=32, fused=False):
        super().__init__()
        self.fc = torch.nn.Linear(width, width)
        self.weight = torch.nn.Parameter(torch.ones(width))
        self.bias = torch.nn.Parameter(torch.zeros(width))
        self.fused = fused

    def norm(self, x):
        if self.fused:
            return F.layer_norm(x, x.shape[-1:], self.weight, self.bias)  # mark: fused_layer_norm
        mu = x.mean(-1, keepdim=True)  # mark: hand_written_norm
        var = (x - mu).pow(2).mean(-1, keepdim=True)
        return (x - mu) / torch.sqrt(var + 1e-5) * self.weight + self.bias

    def forward(self, x):
        h = self.norm(x)
        h = F.gelu(self.fc(h)) * 0.5 + x * 0.5 - x.sigmoid() * x.tanh()  # mark: fire_elementwise_after_a_hand_written_norm fire_elementwise_after_a_fused_norm
        return h + x


def _normed_net(fused):
    torch.manual_seed(0)
    model = Net()
    model.blocks = torch.nn.ModuleList(NormedBlock(fused=fused) for _ in range(3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 16, 32)

    def step():
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()

    return Workload(model=model, step=step, optimizer=opt, name="elem001")


def fire_elementwise_after_a_hand_written_norm():
    return _normed_net(fused=False)


def fire_elementwise_after_a_fused_norm():
    return _normed_net(fused=True)
