"""LOSS002 full-vocab-logits: the loss materialises the full [tokens, vocabulary] logits.

## What it does
Finds a cross-entropy (or log_softmax) whose input has a vocabulary-sized last dimension (at
least 8192 classes) written by a head matmul just before it, and reports the bytes of
logits-sized tensors the loss path writes and reads (the head's output, its upcast, the
log-probabilities kept for backward and their gradients) and the memory they hold.

## Why is this bad?
With a 32k-256k vocabulary the logits are the largest activation of a language model: at 8192
tokens and 32000 classes one fp32 copy is 1 GiB. The eager loss writes them in the head's dtype,
again in fp32, again as log-probabilities, and backward writes their gradient twice: several
full passes over HBM that do no useful math, and gigabytes live at the peak. A fused linear
cross-entropy computes the loss and the head's gradients chunk by chunk and never holds more
than a chunk of logits.

## Example
```python
logits = self.lm_head(hidden)                       # [B*T, V]
loss = F.cross_entropy(logits.float(), labels)
```

Use instead:
```python
from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

loss = LigerFusedLinearCrossEntropyLoss()(self.lm_head.weight, hidden, labels)
```

## Fix
Fused linear cross-entropy (lever `fused-linear-cross-entropy`: Liger Kernel's or Cut
Cross-Entropy's kernel on a GPU where installed, a chunked PyTorch loss elsewhere). Or, keeping
the head's matmul as it is, the loss compiled (lever `compile-loss`, a Hugging Face model's
`loss_function` under `torch.compile`, as torchtitan compiles its loss): inductor reads the
logits once forward and once backward instead of the eager passes; the head's output is still
written. The fixed time above is the fused kernel's; the compiled loss's is not priced.

## Fix safety
Changes numerics: the loss is reduced chunk by chunk in fp32; it agrees with the eager loss to
rounding.

## Known problems
Bytes are counted from the capture's tensors of the logits' size; a CPU capture in float32 has
no upcast (`.float()` of a float32 tensor is a no-op), so it counts one copy fewer than the GPU
run with bf16 autocast. The fixed time assumes the fused kernel writes and reads each chunk of
logits once in the compute dtype. The head matmul's FLOPs are unchanged and not counted.

## References
- https://github.com/linkedin/Liger-Kernel
- Wijmans et al., Cut Your Losses in Large-Vocabulary Language Models (2024), https://arxiv.org/abs/2411.09009
"""

from __future__ import annotations

from collections.abc import Iterator

from levers.capture.records import Capture, CallRecord, TensorMeta
from levers.audit.config import RuleConfig
from levers.audit.cost.roofline import dtype_size
from levers.audit.finding import Finding, Part, Work
from levers.audit.pattern_view import pattern_view
from levers.audit.rules.loss001_loss_over_ignored_rows import input_producers
from levers.audit.patterns import (
    base_name,
    fmt_bytes,
    meta_text,
    receipt,
    with_backward,
)
from levers.audit.rules.registry import registered, rule
from levers.vocab import CHANGES_NUMERICS

CODE, NAME = "LOSS002", "full-vocab-logits"
MIN_VOCAB = 8192
_HEADS = ("mm", "addmm", "matmul", "linear", "bmm")
# passes over the logits a fused kernel makes (write and read a chunk, forward and backward)
FUSED_PASSES = 3


@rule(
    CODE,
    NAME,
    severity="medium",
    fix_safety=CHANGES_NUMERICS,
    levers=("fused-linear-cross-entropy", "compile-loss"),
)
def check(capture: Capture, config: RuleConfig) -> Iterator[Finding]:
    backward = pattern_view(capture).backward
    for call in capture.calls:
        # only class-scoring losses over a logits tensor
        if call.kind != "loss" or call.first_op is None or not call.args.get("input"):
            continue
        shape = call.args["input"]["shape"]
        # a small number of classes: the logits are not the problem
        if not shape or shape[-1] < MIN_VOCAB:
            continue
        producers = input_producers(capture, call)
        head = next((op for op in producers if base_name(op.name) in _HEADS), None)
        # no head matmul wrote it: a fused linear cross-entropy has nothing to fuse
        if head is None:
            continue
        yield _finding(call, head, producers, capture, config, backward)


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _finding(call: CallRecord, head, producers, capture: Capture, config: RuleConfig, backward):
    ops = capture.ops
    shape = call.args["input"]["shape"]
    numel = _numel(shape)
    rows, vocab = numel // shape[-1], shape[-1]
    casts = [op.index for op in producers if op is not head and not op.is_view]
    loss_ops = [i for i in range(call.first_op, call.last_op + 1) if not ops[i].is_view]
    now_ops = with_backward(casts + loss_ops, backward)
    # logits-sized tensors written on the loss path, forward (their bytes at the peak)
    held = 0
    for i in [head.index] + casts + loss_ops:
        for out in ops[i].outputs:
            if _numel(out.shape) == numel:
                held += numel * _held_size(out, i == head.index, config)
    compute = config.compute_dtype(head.outputs[0].dtype)
    fused = Part(
        label="fused linear cross-entropy (chunked logits)",
        bytes=FUSED_PASSES * numel * dtype_size(compute),
        num_kernels=4,
    )
    moved = sum(ops[i].read_bytes + ops[i].write_bytes for i in now_ops)
    message = (
        f"The loss materialises the full logits [{rows}, {vocab}] (vocabulary {vocab:,}): the head "
        f"and the loss path hold about {fmt_bytes(held)} of logits-sized tensors, and "
        f"{len(now_ops)} kernels around the loss move {fmt_bytes(moved)} per step."
    )
    return registered(CODE).finding(
        message=message,
        fix_title="Fuse the head matmul and the cross-entropy (chunked, never the full logits)",
        receipts=(
            receipt(
                call.source,
                module=None if call.module is None else call.module,
                op=call.name,
                shapes=f"input {meta_text(call.args['input'])} from {base_name(head.name)} "
                f"{meta_text(head.outputs[0])}",
            ),
        ),
        severity="high" if held >= 1 << 30 else "medium",
        effort="S",
        risk="low",
        work=Work(fixed=(fused,), now_ops=now_ops, saved_bytes=held),
        details={
            "levers": ["fused-linear-cross-entropy", "compile-loss"],
            "rows": rows,
            "vocab": vocab,
            "logits_bytes_held": held,
            "bytes_moved": moved,
        },
    )


def _held_size(meta: TensorMeta, is_head: bool, config: RuleConfig) -> int:
    # the head runs in the compute dtype on the GPU; the loss path upcasts to fp32 there
    if is_head:
        return dtype_size(config.compute_dtype(meta.dtype))
    return dtype_size(meta.dtype)
