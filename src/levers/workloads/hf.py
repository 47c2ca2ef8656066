"""``hf``: a Hugging Face transformers causal LM built from a config, with random weights.

Nothing is downloaded: the config class is built directly with the shapes of the ``llama``
workload's sizes (tiny, 1b, 8b) and the model comes from ``AutoModelForCausalLM.from_config``.
The step feeds random token ids as both ``input_ids`` and ``labels`` (the model shifts them) and
trains on the loss the model returns with a fused AdamW, under bf16 autocast on a GPU.
``eval_losses`` scores a fixed held-out set of random sequences (drawn from the seed;
:func:`levers.workloads._runtime.held_out_losses`), the quality read of ``levers ab``.

Parameters: ``arch`` (llama | qwen2 | gemma | mistral), ``attn`` (the attention implementation:
eager | sdpa | flex_attention), ``size`` (tiny | 1b | 8b), ``device`` (cpu | cuda), ``dtype``
(parameter dtype, float32), ``seed`` (0), ``batch_size`` and ``seq_len`` (per size, as in
:data:`levers.workloads.llama.SIZES`), ``lengths`` (fixed | longtail | varied). Needs
``pip install 'levers[hf]'``.

``lengths=longtail`` gives the step variable-length data: its ``batch_size`` sequences have
lengths from a long-tailed distribution (:func:`levers.batches.longtail_lengths`: median
``seq_len / 8``, mean at most ``seq_len / 4``, the longest up to ``seq_len``), the same lengths
every step (drawn once from the seed; the tokens are drawn anew each step), padded to the
longest with an ``attention_mask`` and labels -100 on the padding. ``tokens_per_step`` counts
the real tokens only, so tokens/s never counts padding. The step draws its batches through
``step.batches`` (:class:`levers.batches.Batches`), where the data levers (``packing``,
``padding-free``, ``pad-to-multiple``) change their layout.

``lengths=varied`` draws fresh lengths every step from the same distribution
(:func:`levers.batches.varied_lengths`; step k's are ``varied_lengths(batch_size, seq_len,
seed=seed, step=k)``, k counting the batches drawn since the build, so two workloads built from
one seed see the same batches) and pads each batch only to its own longest sequence, as
transformers' ``DataCollatorWithPadding`` does: the padded width changes from step to step,
which is what ``pad-to-multiple`` is for. ``step.batches.lengths`` is None (they vary), so the
layouts read each batch's lengths from its mask. ``tokens_per_step`` is then the expected real
tokens of a step (:func:`levers.batches.varied_mean_tokens`), not each step's own count (at 8
sequences a step's varies by about 13% around it, one standard deviation): tokens/s read from it
is a step rate times a constant. Two variants built from one seed and stepped alike (``levers
ab`` alternates its sides step by step) see the same batches, so their ratio is the ratio of
their step rates on the same data; ``bench/varlen.py`` counts each step's own real tokens.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from typing import Any

import torch

from levers.batches import (
    Batches,
    draw_padded,
    longtail_lengths,
    varied_lengths,
    varied_mean_tokens,
)
from levers.errors import MissingDependency
from levers.optional import import_transformers
from levers.workload import Workload
from levers.workloads import _params, _runtime
from levers.workloads.llama import SIZES, LlamaConfig, step_floor

ARCHS = {
    "llama": "LlamaConfig",
    "qwen2": "Qwen2Config",
    "gemma": "GemmaConfig",
    "mistral": "MistralConfig",
}
ATTN_IMPLEMENTATIONS = ("eager", "sdpa", "flex_attention")
LENGTHS = ("fixed", "longtail", "varied")
LEARNING_RATE = 1e-4


def build(
    *,
    arch: str = "llama",
    attn: str = "sdpa",
    size: str = "tiny",
    device: Any = "cpu",
    dtype: Any = "float32",
    seed: Any = 0,
    batch_size: Any = None,
    seq_len: Any = None,
    lengths: str = "fixed",
) -> Workload:
    """Build the ``hf`` workload; see the module docstring for the parameters."""
    _params.choice("arch", arch, tuple(ARCHS))
    _params.choice("lengths", lengths, LENGTHS)
    _params.choice("attn", attn, ATTN_IMPLEMENTATIONS)
    _params.choice("size", size, tuple(SIZES))
    resolved_device = _params.device(device)
    param_dtype = _params.dtype(dtype)
    resolved_seed = _params.integer("seed", seed)
    if attn == "flex_attention" and resolved_device.type == "cpu":
        raise ValueError(
            "attn=flex_attention trains only on a GPU (FlexAttention has no backward on a CPU): "
            "set device=cuda, or use attn=sdpa here"
        )
    shapes = SIZES[size]
    if batch_size is not None:
        shapes = dataclasses.replace(
            shapes, batch_size=_params.positive_int("batch_size", batch_size)
        )
    if seq_len is not None:
        shapes = dataclasses.replace(shapes, seq_len=_params.positive_int("seq_len", seq_len))
    _runtime.check_step_fits(
        f"arch={arch}, size={size}, batch_size={shapes.batch_size:,}, seq_len={shapes.seq_len:,}",
        step_floor(shapes), resolved_device, param_dtype, "batch_size or seq_len (or the size)",
    )
    transformers = _import_transformers()

    config = model_config(transformers, arch, shapes)
    with (
        _runtime.seeded(resolved_seed, resolved_device),
        _runtime.default_dtype(param_dtype),
        resolved_device,
    ):
        model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=attn)
    model.train()
    optimizer = _runtime.adamw(model, lr=LEARNING_RATE)
    generator = _runtime.data_generator(resolved_seed, resolved_device)
    if lengths == "longtail":
        real = longtail_lengths(shapes.batch_size, shapes.seq_len, seed=resolved_seed)
        batches = Batches(
            draw=lambda: draw_padded(real, shapes.vocab_size, generator), lengths=real
        )
        step = varlen_step(model, optimizer, batches, generator.device)
        tokens = sum(real)
    elif lengths == "varied":
        batches = Batches(draw=varied_draw(shapes, generator, resolved_seed))
        step = varlen_step(model, optimizer, batches, generator.device)
        tokens = varied_mean_tokens(shapes.batch_size, shapes.seq_len)
    else:
        step, tokens = training_step(model, optimizer, shapes, generator), None
    return Workload(
        model=model,
        step=step,
        tokens_per_step=tokens or shapes.batch_size * shapes.seq_len,
        optimizer=optimizer,
        name=f"hf-{arch}-{size}",
        eval_losses=_runtime.held_out_losses(
            model,
            lambda ids_bt: model(input_ids=ids_bt).logits,
            seed=resolved_seed,
            vocab_size=shapes.vocab_size,
            seq_len=shapes.seq_len,
            batch_size=shapes.batch_size,
            device=resolved_device,
        ),
        params={
            "arch": arch,
            "attn": attn,
            "size": size,
            "device": str(resolved_device),
            "dtype": _params.dtype_name(param_dtype),
            "seed": resolved_seed,
            "batch_size": shapes.batch_size,
            "seq_len": shapes.seq_len,
            **({"lengths": lengths} if lengths != "fixed" else {}),
        },
        device=resolved_device,
    )


def model_config(transformers: Any, arch: str, shapes: LlamaConfig) -> Any:
    """The transformers config for ``arch`` with the given shapes."""
    config_class = getattr(transformers, ARCHS[arch])
    extra: dict[str, Any] = {}
    if arch == "mistral":
        # Full causal attention, like the other architectures (Mistral 7B v0.2 onwards).
        extra["sliding_window"] = None
    return config_class(
        vocab_size=shapes.vocab_size,
        hidden_size=shapes.width,
        intermediate_size=shapes.ffn,
        num_hidden_layers=shapes.layers,
        num_attention_heads=shapes.heads,
        num_key_value_heads=shapes.kv_heads,
        head_dim=shapes.head_dim,
        max_position_embeddings=max(shapes.seq_len, 2048),
        # A training step never reads a KV cache; building one would be wasted work.
        use_cache=False,
        **extra,
    )


def training_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    shapes: LlamaConfig,
    generator: torch.Generator,
) -> Callable[[], torch.Tensor]:
    """The step: random tokens as inputs and labels, the model's loss, backward, AdamW."""
    device = generator.device

    def step() -> torch.Tensor:
        ids_bt = torch.randint(
            0,
            shapes.vocab_size,
            (shapes.batch_size, shapes.seq_len),
            generator=generator,
            device=device,
        )
        with _runtime.autocast(device):
            loss = model(input_ids=ids_bt, labels=ids_bt).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    return step


def varied_draw(
    shapes: LlamaConfig, generator: torch.Generator, seed: int
) -> Callable[[], dict[str, torch.Tensor]]:
    """``draw()`` for ``lengths=varied``: the k-th call gives random tokens of
    ``varied_lengths(batch_size, seq_len, seed=seed, step=k)``, padded to their longest."""
    drawn = itertools.count()

    def draw() -> dict[str, torch.Tensor]:
        lengths = varied_lengths(shapes.batch_size, shapes.seq_len, seed=seed, step=next(drawn))
        return draw_padded(lengths, shapes.vocab_size, generator)

    return draw


def varlen_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batches: Batches,
    device: torch.device,
) -> Callable[[], torch.Tensor]:
    """The step on padded variable-length batches: each step's batch comes from ``batches``
    (random tokens padded to the longest, then any data lever's layout), the model's loss (the
    mean over real targets), backward, AdamW."""

    def step() -> torch.Tensor:
        batch = batches.next()
        with _runtime.autocast(device):
            loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    step.batches = batches  # type: ignore[attr-defined]
    return step


def _import_transformers() -> Any:
    try:
        transformers = import_transformers()
    except ImportError:
        raise MissingDependency(
            "the hf workload needs Hugging Face transformers, which is not installed; install it "
            "with: pip install 'levers[hf]'  (or: pip install transformers)"
        ) from None
    return transformers
