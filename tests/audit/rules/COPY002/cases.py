"""COPY002 fixtures: a bf16 model on the CPU whose logits are upcast before the loss."""

# fmt: off
# (the cases are laid out by hand: tests find the lines marked `# mark: <case>`)

import torch
import torch.nn.functional as F

from levers import Workload

VOCAB = 16384
ROWS = 256  # ROWS x VOCAB fp32 = 16 MiB, the rule's threshold


class Head(torch.nn.Module):
    def __init__(self, dtype):
        super().__init__()
        self.lm_head = torch.nn.Linear(64, VOCAB, bias=False, dtype=dtype)


def _workload(rows, dtype, upcast, autocast=False):
    torch.manual_seed(0)
    model = Head(dtype)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hidden = torch.randn(rows, 64, dtype=dtype)
    targets = torch.randint(0, VOCAB, (rows,), generator=torch.Generator().manual_seed(0))

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logits = model.lm_head(hidden)
        if upcast:
            logits = logits.float()  # mark: fire_logits_upcast
        F.cross_entropy(logits, targets).backward()
        opt.step()
        opt.zero_grad()

    return Workload(model=model, step=step, optimizer=opt, name="copy002")


def fire_logits_upcast():
    return _workload(ROWS, torch.bfloat16, upcast=True)


def ok_loss_upcasts_inside():
    return _workload(ROWS, torch.bfloat16, upcast=False)


def ok_upcast_under_autocast_feeding_a_loss_over_valid_rows():
    # autocast casts cross_entropy's input to fp32 anyway: the explicit cast adds nothing
    return _workload(ROWS, torch.float32, upcast=True, autocast=True)


def ok_small_upcast():
    return _workload(16, torch.bfloat16, upcast=True)


def regress_fp32_model_no_op_cast():
    # in fp32 .float() returns its input: no op, nothing to see (a CPU capture's blind spot)
    return _workload(ROWS, torch.float32, upcast=True)
