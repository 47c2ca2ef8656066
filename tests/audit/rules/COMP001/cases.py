"""COMP001 fixtures: steps compiled with the eager backend (dynamo's tracing and guards, no
inductor), whose warm-up step compiles before the capture."""

# fmt: off
# (the cases are laid out by hand: tests find the lines marked `# mark: <case>`)

import torch

from levers import Workload


class IndexedBlock(torch.nn.Module):
    def __init__(self, index):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)
        self.layer_idx = index

    def forward(self, x):  # mark: fire_recompile_per_block
        return self.linear(x) * (self.layer_idx + 1)


class LeverBlock(IndexedBlock):  # its own code object: dynamo's cache of the one above stays out
    def forward(self, x):
        return self.linear(x) * (self.layer_idx + 1)


class BreakingModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

    def forward(self, x):
        x = self.a(x)
        torch._dynamo.graph_break()  # mark: fire_graph_break
        return self.b(x)


class PlainModel(BreakingModel):
    def forward(self, x):
        return self.b(self.a(x))


def _workload(model, compile_blocks=False, compile_model=False):
    torch.manual_seed(0)
    # dynamo's caches as a fresh process has them: what other tests compiled stays out
    torch._dynamo.reset()
    if compile_blocks:
        for block in model:
            block.compile(backend="eager")
    if compile_model:
        model.compile(backend="eager")
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(4, 8)

    def step():
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()

    return Workload(model=model, step=step, optimizer=opt, name="comp001")


def fire_recompile_per_block():
    model = torch.nn.Sequential(*(IndexedBlock(i) for i in range(4)))
    return _workload(model, compile_blocks=True)


def fire_graph_break():
    return _workload(BreakingModel(), compile_model=True)


def ok_not_compiled():
    return _workload(torch.nn.Sequential(*(IndexedBlock(i) for i in range(3))))


def ok_compiled_once():
    return _workload(PlainModel(), compile_model=True)


def ok_blocks_through_the_lever():
    import levers

    model = torch.nn.Sequential(*(LeverBlock(i) for i in range(4)))
    workload = _workload(model)
    levers.apply(workload, "compile-blocks", backend="eager")  # stays on for the capture
    return workload
