"""LOSS002 fixtures: a language-model head over a 16k vocabulary into cross_entropy, and a small
classifier."""

# fmt: off
# (the cases are laid out by hand: tests find the lines marked `# mark: <case>`)

import torch
import torch.nn.functional as F

from levers import Workload


class LM(torch.nn.Module):
    def __init__(self, vocab, width=32):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.head = torch.nn.Linear(width, vocab, bias=False)

    def forward(self, ids):
        return self.head(self.embed(ids))


def _workload(vocab):
    torch.manual_seed(0)
    model = LM(vocab)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ids = torch.randint(0, vocab, (2, 32))

    def step():
        logits = model(ids)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), ids.flatten())  # mark: fire_large_vocab
        loss.backward()
        opt.step()
        opt.zero_grad()

    return Workload(model=model, step=step, optimizer=opt, name="loss002")


def fire_large_vocab():
    return _workload(16384)


def ok_small_classifier():
    return _workload(1000)
