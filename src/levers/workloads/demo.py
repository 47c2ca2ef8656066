"""``demo``: a small vision-language model with eight planted training inefficiencies.

The model has the shape of a real vision-language-action training codebase: a ViT over image
patches, a projector into the text width, a text decoder run once over the prefix (image tokens +
text tokens) to fill a KV cache, and a teacher-forced suffix of answer-text and action tokens that
attends to [prefix cache + suffix] under a dense additive mask with grouped-query attention, scored
by a 152k-vocabulary LM head (at ``size=1b``). The inefficiencies are the ones an expert review of
that codebase found. Each is switched off by naming it in ``fixed``, and each sits on a source
line marked ``# [demo:<flag>]`` (:func:`levers.workloads.demo_sites.inefficiency_sites` lists
them).

| flag          | the inefficiency              | where (function)        | the fix             |
| ------------- | ----------------------------- | ----------------------- | ------------------- |
| suffix_attn   | suffix SDPA pinned to [FLASH, | suffix_attention        | admit cuDNN (first) |
|               | EFFICIENT, MATH]: with a      |                         | in the pin; exact   |
|               | dense mask and GQA only MATH  |                         |                     |
|               | is eligible                   |                         |                     |
| vit_attn      | ViT attention written out:    | eager_attention         | fused SDPA without  |
|               | einsum scores, masked_fill,   |                         | a mask; numerics    |
|               | fp32 softmax, einsum          |                         |                     |
| norm          | hand-rolled RMSNorm: an fp32  | rms_norm_eager          | F.rms_norm, same    |
|               | round trip in ~6 elementwise  |                         | weight and eps;     |
|               | kernels                       |                         | numerics            |
| checkpointing | no activation checkpointing   | TextDecoder.prefix,     | checkpoint() per    |
|               | in the prefix pass            | VisionTower.forward     | block; exact        |
| loss          | logit blocks concatenated,    | suffix_loss_all_rows    | gather the real     |
|               | then upcast to fp32 over all  |                         | rows first;         |
|               | rows, ~half of them padding   |                         | numerics            |
| syncs         | int(is_patch.sum()),          | DemoVLM.embed_prefix,   | counts and row      |
|               | bool(is_extension.any()) and  | TokenEmbedding.forward, | indices known on    |
|               | a boolean-index loss          | suffix_loss_all_rows    | the host; exact     |
| clone         | prefix embeddings cloned only | DemoVLM.embed_prefix    | scatter in place;   |
|               | to scatter image features     |                         | exact               |
|               | into them                     |                         |                     |
| peak_metric   | max_memory_allocated() never  | training_step           | reset the peak      |
|               | reset: a lifetime ratchet,    |                         | stats at each step; |
|               | not the step's peak           |                         | exact               |

The functions live in demo_text.py, demo_vision.py, demo_model.py, demo_loss.py and demo.py.
"exact" fixes give bitwise-identical losses and gradients on a CPU; "numerics" fixes change the
floating-point results within a small tolerance.

Parameters: ``size`` (tiny | 1b), ``device`` (cpu | cuda), ``dtype`` (parameter dtype, float32),
``seed`` (0), ``batch_size`` (2 for tiny, 8 for 1b), ``fixed`` ("none", "all", "a,b" or a list of
flags). On a GPU the step runs under bf16 autocast.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from levers.workload import Workload
from levers.workloads import _params, _runtime
from levers.workloads.demo_config import SIZES, DemoConfig, DemoFixes, parse_fixed
from levers.workloads.demo_data import DemoLayout, make_layout, sample_batch
from levers.workloads.demo_model import DemoVLM

LEARNING_RATE = 1e-4


def build(
    *,
    size: str = "tiny",
    device: Any = "cpu",
    dtype: Any = "float32",
    seed: Any = 0,
    batch_size: Any = None,
    fixed: Any = "none",
) -> Workload:
    """Build the ``demo`` workload; see the module docstring for the parameters and flags."""
    _params.choice("size", size, tuple(SIZES))
    resolved_device = _params.device(device)
    param_dtype = _params.dtype(dtype)
    resolved_seed = _params.integer("seed", seed)
    cfg = SIZES[size]
    if batch_size is not None:
        cfg = cfg.with_batch_size(_params.positive_int("batch_size", batch_size))
    fixes = parse_fixed(fixed)

    with (
        _runtime.seeded(resolved_seed, resolved_device),
        _runtime.default_dtype(param_dtype),
        resolved_device,
    ):
        model = DemoVLM(cfg, fixes)
    optimizer = _runtime.adamw(model, lr=LEARNING_RATE)
    layout = make_layout(cfg, resolved_seed, resolved_device)
    generator = _runtime.data_generator(resolved_seed, resolved_device)
    return Workload(
        model=model,
        step=training_step(model, optimizer, cfg, fixes, layout, generator, param_dtype),
        tokens_per_step=cfg.batch_size * (cfg.prefix_len + cfg.suffix_len),
        optimizer=optimizer,
        name=f"demo-{size}",
        params={
            "size": size,
            "device": str(resolved_device),
            "dtype": _params.dtype_name(param_dtype),
            "seed": resolved_seed,
            "batch_size": cfg.batch_size,
            "fixed": fixes.names(),
        },
        device=resolved_device,
    )


def training_step(
    model: DemoVLM,
    optimizer: torch.optim.Optimizer,
    cfg: DemoConfig,
    fixes: DemoFixes,
    layout: DemoLayout,
    generator: torch.Generator,
    param_dtype: torch.dtype,
) -> Callable[[], torch.Tensor]:
    """The step: draw a batch, forward, backward, optimizer step; returns the detached loss."""
    device = generator.device

    def step() -> torch.Tensor:
        if fixes.peak_metric and torch.cuda.is_available():
            # Start the window: the peak read below is this step's, not the run's so far.
            torch.cuda.reset_peak_memory_stats()
        batch = sample_batch(cfg, layout, generator, param_dtype)
        with _runtime.autocast(device):
            loss = model(batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        # [demo:peak_metric] Never reset, this "peak" only ratchets up over the run.
        model.metrics["peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
        return loss.detach()

    return step
