"""MEM002 fixtures: peak-memory reads with and without a reset of the peak.

On a CPU no CUDA call runs, so a reset guarded by torch.cuda.is_available() only shows in the
source; the rule evaluates such guards statically, with the step's closure.
"""

# fmt: off
# (the cases are laid out by hand: tests find the lines marked `# mark: <case>`)

import torch

from levers import Workload


def _parts():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return model, opt, torch.randn(2, 4), {}


def _train(model, opt, x):
    model(x).sum().backward()
    opt.step()
    opt.zero_grad()


def fire_never_reset():
    model, opt, x, metrics = _parts()

    def step():
        _train(model, opt, x)
        metrics["peak"] = torch.cuda.max_memory_allocated()  # mark: fire_never_reset

    return Workload(model=model, step=step, optimizer=opt, name="mem002")


def fire_reset_switched_off():
    model, opt, x, metrics = _parts()
    window = False

    def step():
        if window and torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        _train(model, opt, x)
        metrics["peak"] = torch.cuda.max_memory_reserved()  # mark: fire_reset_switched_off

    return Workload(model=model, step=step, optimizer=opt, name="mem002")


def ok_reset_when_cuda():
    model, opt, x, metrics = _parts()
    window = True

    def step():
        if window and torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        _train(model, opt, x)
        metrics["peak"] = torch.cuda.max_memory_allocated()

    return Workload(model=model, step=step, optimizer=opt, name="mem002")


def ok_no_metric():
    model, opt, x, metrics = _parts()

    def step():
        _train(model, opt, x)
        metrics["loss"] = 0.0

    return Workload(model=model, step=step, optimizer=opt, name="mem002")


def regress_reset_only_without_cuda():
    # the reset is guarded by "not cuda": on a GPU the peak is never reset
    model, opt, x, metrics = _parts()
    window = False

    def step():
        _train(model, opt, x)
        metrics["peak"] = torch.cuda.max_memory_allocated()
        if not torch.cuda.is_available() and window:
            torch.cuda.reset_peak_memory_stats()

    return Workload(model=model, step=step, optimizer=opt, name="mem002")
