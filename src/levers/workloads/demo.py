"""``demo``: a small vision-language model with eight planted training inefficiencies.

The model has the shape of a real vision-language-action training codebase: a ViT over image
patches, a projector into the text width, a text decoder run once over the prefix (image tokens +
text tokens) to fill a KV cache, and a teacher-forced suffix of answer-text and action tokens that
attends to [prefix cache + suffix] under a dense additive mask with grouped-query attention, scored
by a 152k-vocabulary LM head (at ``size=1b``). The inefficiencies are the ones an expert review of
that codebase found. Each is switched off by naming it in ``fixed``, and each sits on a source
line marked ``# [demo:<flag>]`` (:func:`levers.workloads.demo_sites.inefficiency_sites` lists
them).

| flag          | the inefficiency                                  | where                      | the fix (``fixed=<flag>``)             |
| ------------- | ------------------------------------------------- | -------------------------- | -------------------------------------- |
| suffix_attn   | the suffix SDPA is pinned to [FLASH, EFFICIENT,   | demo_text.suffix_attention | admit ``SDPBackend.CUDNN_ATTENTION``   |
|               | MATH]; flash rejects the dense mask, efficient    |                            | (first) in the pin. Exact.             |
|               | rejects GQA, so a GPU runs MATH                   |                            |                                        |
| vit_attn      | ViT attention written out: einsum scores,         | demo_vision.eager_attention| ``F.scaled_dot_product_attention``     |
|               | masked_fill, fp32 softmax, einsum                 |                            | without a mask. Changes numerics.      |
| norm          | hand-rolled RMSNorm: an fp32 round trip in ~6     | demo_text.rms_norm_eager   | ``F.rms_norm`` with the same weight    |
|               | elementwise kernels                               |                            | and eps. Changes numerics.             |
| checkpointing | no activation checkpointing: every block's        | TextDecoder.prefix,        | non-reentrant ``checkpoint`` per block |
|               | activations are kept for backward                 | VisionTower.forward        | of the prefix pass. Exact.             |
| loss          | the logit blocks are concatenated, then upcast to | demo_loss.                 | gather the real rows of each block     |
|               | fp32 over all rows, ~half of them padding         | suffix_loss_all_rows       | first (indices built on the host), CE  |
|               |                                                   |                            | summed / count. Changes numerics.      |
| syncs         | host-device syncs: ``int(is_patch.sum())``,       | DemoVLM.embed_prefix,      | counts known on the host, no branch on |
|               | ``bool(is_extension.any())``, a boolean-index     | TokenEmbedding.forward,    | device values, a host-built row index. |
|               | loss                                              | suffix_loss_all_rows       | Exact.                                 |
| clone         | the prefix embeddings are cloned only to scatter  | DemoVLM.embed_prefix       | scatter in place into the fresh        |
|               | image features into them                          |                            | embedding output. Exact.               |
| peak_metric   | ``max_memory_allocated()`` is never reset: the    | demo.training_step         | ``reset_peak_memory_stats()`` at the   |
|               | recorded "peak" is a lifetime ratchet             | (the step)                 | start of every step. Exact.            |

"Exact" fixes give bitwise-identical losses and gradients on a CPU; the others change the
floating-point results within a small tolerance.

Parameters: ``size`` (tiny | 1b), ``device`` (cpu | cuda), ``dtype`` (parameter dtype, float32),
``seed`` (0), ``batch_size`` (2 for tiny, 8 for 1b), ``fixed`` ("none", "all", "a,b" or a list of
flags). On a GPU the step runs under bf16 autocast.
"""

from __future__ import annotations

from typing import Any, Callable

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
    optimizer = _runtime.adamw(model, resolved_device, lr=LEARNING_RATE)
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
