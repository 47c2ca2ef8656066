"""PAD001 fixtures: a causal LM whose batch is half padding, one with a little padding (reported
as not worth it), and one whose only ignored targets are the causal shift (with attention and
without); a masked LM's targets (85% ignored, scattered inside the rows: not padding), and a
masked LM whose rows end in padding."""

# fmt: off
# (the cases are laid out by hand: tests find the lines marked `# mark: <case>`)

import torch
import torch.nn.functional as F

from levers import Workload


class TinyLM(torch.nn.Module):
    def __init__(self, vocab=64, width=32, heads=2):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.head = torch.nn.Linear(width, vocab)
        self.heads = heads

    def forward(self, ids):
        x = self.embed(ids)
        b, t, w = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, w // self.heads).transpose(1, 3).unbind(2)
        x = x + F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, w)
        return self.head(x)


class NoAttentionLM(torch.nn.Module):
    """A language model without attention (no SDPA call to read the sequences' shape from), as
    RWKV's and Mamba's are."""

    def __init__(self, vocab=64, width=32):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.head = torch.nn.Linear(width, vocab)

    def forward(self, ids):
        return self.head(self.embed(ids).cumsum(1))


def _training(ids, labels, name, model_class=TinyLM):
    """A step of ``model_class`` on ``ids`` against ``labels`` (one cross-entropy over every
    token)."""
    torch.manual_seed(0)
    model = model_class()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step():
        logits = model(ids)
        loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)  # mark: fire_half_padding fire_little_padding fire_half_padding_measured fire_masked_lm_with_padding
        loss.backward()
        opt.step()
        opt.zero_grad()

    return Workload(model=model, step=step, optimizer=opt, name=name)


def _workload(num_padding, batch=4, length=32, model_class=TinyLM):
    torch.manual_seed(0)
    ids = torch.randint(0, 64, (batch, length))
    labels = ids.clone()
    labels[:, length - num_padding:] = -100  # batch-max padding at the end of every row
    labels = torch.cat([labels[:, 1:], torch.full((batch, 1), -100)], dim=1)  # the causal shift
    return _training(ids, labels, "pad001", model_class)


def _masked_lm(num_padding, batch=8, length=64):
    """A masked LM's step: 15% of the tokens drawn as targets, the rest ignored (-100), and the
    last ``num_padding`` tokens of every row padding."""
    torch.manual_seed(0)
    ids = torch.randint(0, 64, (batch, length))
    labels = torch.where(torch.rand(batch, length) < 0.15, ids, torch.full_like(ids, -100))
    labels[:, length - num_padding:] = -100
    return _training(ids, labels, "pad001-mlm")


def fire_half_padding():
    return _workload(16)


def fire_little_padding():
    return _workload(1, length=48)


def ok_only_the_causal_shift():
    return _workload(0)


def ok_only_the_causal_shift_without_attention():
    # the shift is read from the rows, not from an attention call's shape
    return _workload(0, model_class=NoAttentionLM)


def _measured(capture):
    """The capture as if it had run on an H100 with 10 us per kernel and 10% idle: the step's
    time then grows with its tokens, as at training sizes."""
    import dataclasses

    ops = tuple(
        dataclasses.replace(op, device_us=None if op.is_view else 10.0) for op in capture.ops
    )
    busy_s = sum(op.device_us or 0.0 for op in ops) / 1e6
    env = {**capture.env, "device": "cuda:0", "device_name": "NVIDIA H100 80GB HBM3"}
    timing = dataclasses.replace(capture.timing, step_s=(busy_s * 1.1,))
    return dataclasses.replace(capture, env=env, ops=ops, timing=timing)


def ok_a_masked_lm_s_unmasked_tokens():
    return _masked_lm(0)


def fire_masked_lm_with_padding():
    return _masked_lm(24)


def fire_half_padding_measured():
    return _workload(16)  # the same step as fire_half_padding, with device time


TRANSFORM = {"fire_half_padding_measured": _measured}
