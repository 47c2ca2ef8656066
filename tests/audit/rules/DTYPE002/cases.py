"""DTYPE002 fixtures: a mixture of experts' experts written as transformers writes them (tokens
sorted by expert, one grouped matmul per projection, the input cast to the weights' dtype), with
fp32 parameters, run under CPU bf16 autocast as a GPU step runs under CUDA bf16 autocast. At
1024 tokens, width 256 and ffn 512 the six grouped matmuls of a step (two forward, four backward)
are 1.61 GFLOP."""

# fmt: off
# (the cases are laid out by hand: tests find the lines marked `# mark: <case>`)

import torch
from audit_helpers import relabel_as_gpu

from levers import Workload

NUM_EXPERTS, WIDTH, FFN = 4, 256, 512


class Experts(torch.nn.Module):
    def __init__(self, grouped_mm):
        super().__init__()
        self.gate_up = torch.nn.Parameter(torch.randn(NUM_EXPERTS, WIDTH, FFN) * 0.02)
        self.down = torch.nn.Parameter(torch.randn(NUM_EXPERTS, FFN, WIDTH) * 0.02)
        self.grouped_mm = grouped_mm

    def forward(self, x, offs):
        h = self.grouped_mm(x.to(self.gate_up.dtype), self.gate_up, offs=offs)  # mark: fire_bf16_autocast fire_fp16_autocast fire_assumed_autocast
        return self.grouped_mm(torch.relu(h).to(self.down.dtype), self.down, offs=offs)


class Moe(torch.nn.Module):
    def __init__(self, grouped_mm=torch._grouped_mm, vocab=0):
        super().__init__()
        self.proj = torch.nn.Linear(WIDTH, WIDTH, bias=False)
        self.experts = Experts(grouped_mm)
        self.head = torch.nn.Linear(WIDTH, vocab, bias=False) if vocab else None

    def forward(self, x, offs):
        y = self.experts(self.proj(x), offs)
        if self.head is None:
            return y
        # a head kept in fp32, as some models keep theirs (and fp32 is 5x bf16's speed on this CPU)
        with torch.autocast("cpu", enabled=False):
            return self.head(y.float())


def _workload(
    *, tokens=1024, dtype=torch.float32, autocast=torch.bfloat16, grouped_mm=torch._grouped_mm,
    vocab=0,
):
    torch.manual_seed(0)
    model = Moe(grouped_mm, vocab).to(dtype)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(tokens, WIDTH, dtype=dtype)
    # tokens already sorted by expert, an even share each
    offs = torch.arange(1, NUM_EXPERTS + 1, dtype=torch.int32) * (tokens // NUM_EXPERTS)

    def step():
        with torch.autocast("cpu", dtype=autocast or torch.bfloat16, enabled=autocast is not None):
            loss = model(x, offs).float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()

    return Workload(model=model, step=step, optimizer=opt, name="dtype002")


def _transformers_fallback(x, w, offs):
    # transformers' per-expert custom op, what it runs under torch.compile with fp32 weights,
    # called eagerly here
    return torch.ops.transformers.grouped_mm_fallback(x, w, offs=offs)  # mark: fire_transformers_fallback


def fire_bf16_autocast():
    return _workload()


def fire_fp16_autocast():
    return _workload(autocast=torch.float16)


def fire_transformers_fallback():
    # registers transformers::grouped_mm_fallback; imported here, not at the top, so that the
    # other cases do not pay for importing transformers
    import transformers.integrations.moe  # noqa: F401

    return _workload(grouped_mm=_transformers_fallback)


def ok_bf16_weights():
    # the input is cast to the weights' bf16: the grouped matmuls run in bf16
    return _workload(dtype=torch.bfloat16)


def fire_assumed_autocast():
    # a CPU capture in fp32: its GPU run is assumed to autocast to bf16, which would leave the
    # grouped matmuls in fp32
    return _workload(autocast=None)


def ok_no_autocast_declared():
    # the GPU run is declared fp32 (--assume-dtype fp32): fp32 by choice, grouped matmuls included
    return _workload(autocast=None)


def ok_no_autocast_on_gpu():
    # a GPU capture without autocast: fp32 by choice
    return _workload(autocast=None)


def ok_small_grouped_mm():
    # 256 tokens: 0.40 GFLOP of grouped matmuls per step, under the 1 GFLOP floor
    return _workload(tokens=256)


def ok_tiny_share():
    # 640 tokens: 1.01 GFLOP of grouped matmuls next to an fp32 head's 10.1 GFLOP (9%)
    return _workload(tokens=640, vocab=10240)


CONFIG = {"ok_no_autocast_declared": {"assume_dtype": "fp32"}}
TRANSFORM = {"ok_no_autocast_on_gpu": relabel_as_gpu}
