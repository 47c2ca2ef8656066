"""DTYPE003 fixtures: a bf16 model whose gate and up projections (K=512, N=2048) pass float8's
filter, beside a down projection that is too small (K=2048, N=512) and an output head (N=1024,
the vocabulary). On a CPU capture the share is of FLOPs and the GPU is the target (CONFIG); the
GPU cases are CPU captures made to look like a GPU's (TRANSFORM): its name and recorded compute
capability, each matmul's kernel timed at 1 us per 0.1 GFLOP and every other kernel at
OTHER_US, the step 10% longer than its kernels."""

# fmt: off
# (the cases are laid out by hand: tests find the lines marked `# mark: <case>`)

import dataclasses

import torch
import torch.nn.functional as F

from levers import Workload
from levers.capture.records import StepTiming

VOCAB, WIDTH, FFN = 1024, 512, 2048
TOKENS = (2, 64)
US_PER_FLOP = 1e-8  # 1 us per 0.1 GFLOP
OTHER_US = 0.1  # every kernel without FLOPs
SLOW_OTHER_US = 2.0  # the same step with slow elementwise kernels: the linears are a small share


class Mlp(torch.nn.Module):
    def __init__(self, width=WIDTH, ffn=FFN, vocab=VOCAB, head="lm_head"):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.gate = torch.nn.Linear(width, ffn, bias=False)
        self.up = torch.nn.Linear(width, ffn, bias=False)
        self.down = torch.nn.Linear(ffn, width, bias=False)
        setattr(self, head, torch.nn.Linear(width, vocab, bias=False))
        self.head_name = head

    def forward(self, ids):
        x = self.embed(ids)
        h = F.silu(self.gate(x)) * self.up(x)  # mark: fire_cpu_h200 fire_gpu_h200 fire_gpu_the_table_lacks
        x = x + self.down(h)
        return getattr(self, self.head_name)(x)


class SmallMlp(torch.nn.Module):
    """Only linears float8 leaves as too small (K <= 4096 and N <= 1024)."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, 1024)
        self.fc1 = torch.nn.Linear(1024, 1024, bias=False)
        self.fc2 = torch.nn.Linear(1024, 1024, bias=False)
        self.lm_head = torch.nn.Linear(1024, VOCAB, bias=False)

    def forward(self, ids):
        x = self.embed(ids)
        x = x + self.fc2(torch.relu(self.fc1(x)))
        return self.lm_head(x)


class HeadOnly(torch.nn.Module):
    """One large projection, onto the vocabulary (N = the embedding's rows), named decoder."""

    def __init__(self, vocab=8192):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, WIDTH)
        self.norm = torch.nn.LayerNorm(WIDTH)
        self.decoder = torch.nn.Linear(WIDTH, vocab, bias=False)

    def forward(self, ids):
        return self.decoder(self.norm(self.embed(ids)))


def _workload(model=None, dtype=torch.bfloat16, float8=False):
    torch.manual_seed(0)
    model = (model or Mlp()).to(dtype)
    if float8:
        from torchao.float8 import convert_to_float8_training

        convert_to_float8_training(model, module_filter_fn=lambda m, path: path in ("gate", "up"))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    ids = torch.randint(0, model.embed.num_embeddings, TOKENS)

    def step():
        logits = model(ids)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), ids.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad()

    return Workload(model=model, step=step, optimizer=opt, name="dtype003")


fire_cpu_h200 = _workload
fire_gpu_h200 = _workload
fire_gpu_the_table_lacks = _workload
ok_cpu_a100 = _workload
ok_gpu_a100 = _workload
ok_gpu_small_share = _workload


def ok_small_linears():
    return _workload(SmallMlp())


def ok_head_only():
    return _workload(HeadOnly())


def ok_fp32_on_gpu():
    return _workload(dtype=torch.float32)


def ok_float8_already():
    return _workload(float8=True)


def _on_gpu(device_name, capability, other_us=OTHER_US):
    """The capture as one that ran on ``device_name`` (compute capability ``capability``)."""
    def transform(capture):
        ops = tuple(
            dataclasses.replace(
                op,
                device_us=0.0 if op.is_view else (op.flops * US_PER_FLOP if op.flops else other_us),
            )
            for op in capture.ops
        )
        step_s = sum(op.device_us for op in ops) * 1.1 / 1e6
        env = {**capture.env, "device": "cuda:0", "device_name": device_name,
               "gpu": {"name": device_name, "capability": capability}}
        return dataclasses.replace(
            capture, ops=ops, env=env, timing=StepTiming(step_s=(step_s,), captured_step_s=step_s),
        )

    return transform


CONFIG = {
    "fire_cpu_h200": {"target": "h200"},
    "ok_cpu_a100": {"target": "a100"},
    "ok_small_linears": {"target": "h200"},
    "ok_head_only": {"target": "h200"},
    # the recorded capability decides, not the target (which stands in for a GPU levers lacks)
    "fire_gpu_the_table_lacks": {"target": "a100"},
}
TRANSFORM = {
    "fire_gpu_h200": _on_gpu("NVIDIA H200", "9.0"),
    "fire_gpu_the_table_lacks": _on_gpu("NVIDIA L40S", "8.9"),
    "ok_gpu_a100": _on_gpu("NVIDIA A100-SXM4-80GB", "8.0"),
    "ok_gpu_small_share": _on_gpu("NVIDIA H200", "9.0", other_us=SLOW_OTHER_US),
    "ok_fp32_on_gpu": _on_gpu("NVIDIA H200", "9.0"),
    "ok_float8_already": _on_gpu("NVIDIA H200", "9.0"),
}
