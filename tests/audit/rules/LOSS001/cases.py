"""LOSS001 fixtures: losses over padded targets, and over real targets only."""

# fmt: off
# (the cases are laid out by hand: tests find the lines marked `# mark: <case>`)

import torch
import torch.nn.functional as F

from levers import Workload

IGNORE = -100


def _workload(num_ignored, *, select=False, nll=False):
    torch.manual_seed(0)
    head = torch.nn.Linear(32, 128, bias=False)
    opt = torch.optim.SGD(head.parameters(), lr=0.1)
    hidden = torch.randn(64, 32)
    targets = torch.randint(0, 128, (64,), generator=torch.Generator().manual_seed(0))
    targets[64 - num_ignored :] = IGNORE
    rows = torch.arange(64 - num_ignored)

    def step():
        h = hidden.index_select(0, rows) if select else hidden
        t = targets.index_select(0, rows) if select else targets
        logits = head(h)
        if nll:
            loss = F.nll_loss(logits.log_softmax(-1), t, ignore_index=IGNORE)  # mark: regress_nll_loss
        else:
            loss = F.cross_entropy(logits, t, ignore_index=IGNORE)  # mark: fire_half_ignored
        loss.backward()
        opt.step()
        opt.zero_grad()

    return Workload(model=head, step=step, optimizer=opt, name="loss001")


def fire_half_ignored():
    return _workload(32)


def ok_rows_selected():
    return _workload(32, select=True)


def ok_few_ignored():
    return _workload(2)  # 3%: under the rule's 5% floor


def regress_nll_loss():
    return _workload(48, nll=True)
