"""DTYPE001 fixtures: a 2 GFLOP matmul in float32. On a CPU capture the rule fires only when
the GPU run is declared fp32 (CONFIG: assume_dtype=fp32), or on a GPU capture (TRANSFORM)."""

# fmt: off
# (the cases are laid out by hand: tests find the lines marked `# mark: <case>`)

import dataclasses

import torch
from audit_helpers import relabel_as_gpu

from levers import Workload


def _workload(dtype=torch.float32):
    torch.manual_seed(0)
    model = torch.nn.Linear(1024, 1024, bias=False, dtype=dtype)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(1024, 1024, dtype=dtype)

    def step():
        model(x).float().pow(2).mean().backward()  # mark: fire_fp32_declared fire_fp32_on_gpu
        opt.step()
        opt.zero_grad()

    return Workload(model=model, step=step, optimizer=opt, name="dtype001")


def fire_fp32_declared():
    return _workload()


def fire_fp32_on_gpu():
    return _workload()


def ok_assumed_autocast():
    return _workload()


def ok_bf16():
    return _workload(torch.bfloat16)


def ok_tf32_on_gpu():
    return _workload()


def _convnet():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(64, 64, 3, padding=1, bias=False),
        torch.nn.ReLU(),
        torch.nn.Conv2d(64, 64, 3, padding=1, bias=False),
    )
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(4, 64, 64, 64)

    def step():
        model(x).pow(2).mean().backward()  # mark: fire_fp32_convnet_on_gpu
        opt.step()
        opt.zero_grad()

    return Workload(model=model, step=step, optimizer=opt, name="dtype001")


def fire_fp32_convnet_on_gpu():
    # 1.2 GFLOP per convolution in fp32: a convnet without autocast (defect N11)
    return _convnet()


def _with_tf32(capture):
    capture = relabel_as_gpu(capture)
    return dataclasses.replace(capture, settings={**capture.settings, "cuda_matmul_allow_tf32": True})


CONFIG = {"fire_fp32_declared": {"assume_dtype": "fp32"}}
TRANSFORM = {
    "fire_fp32_on_gpu": relabel_as_gpu, "ok_tf32_on_gpu": _with_tf32,
    "fire_fp32_convnet_on_gpu": relabel_as_gpu,
}
