"""Pieces every built-in training step shares: seeding, autocast, the optimizer, the held-out
loss that ``levers ab`` reads as its quality read, and the check that a step can fit the device
it is about to run on (:func:`check_step_fits`)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch._guards
import torch.nn.functional as F

from levers.units import format_bytes

# the held-out set of a language-model workload: this many sequences, drawn from their own
# generator (seeded from the workload's seed plus this offset), never from the training stream
NUM_HELD_OUT = 32
HELD_OUT_SEED_OFFSET = 1_000_003


@contextlib.contextmanager
def seeded(seed: int, device: torch.device) -> Iterator[None]:
    """Seed the global RNGs for model initialisation, leaving the caller's RNG state untouched."""
    cuda_devices = []
    if device.type == "cuda" and torch.cuda.is_available():
        cuda_devices = [device.index if device.index is not None else torch.cuda.current_device()]
    with torch.random.fork_rng(devices=cuda_devices):
        torch.manual_seed(seed)
        yield


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Create parameters directly in ``dtype``.

    Casting a built model with ``.to(dtype)`` would hold two copies for a moment, and it fails
    on the parameters of a fake-tensor model.
    """
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def data_generator(seed: int, device: torch.device) -> torch.Generator:
    """The generator that the synthetic batches are drawn from, on the workload's device."""
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    return generator


def autocast(device: torch.device) -> contextlib.AbstractContextManager:
    """bf16 autocast on a GPU (the usual mixed-precision recipe); full precision on a CPU."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def adamw(model: torch.nn.Module, lr: float) -> torch.optim.AdamW:
    """AdamW fused into one kernel per parameter group.

    The fused kernel also reads its step count as a tensor; the unfused ones call ``.item()`` on
    it for every parameter, which a capture would report as host reads.
    """
    return torch.optim.AdamW(model.parameters(), lr=lr, fused=True)


def held_out_losses(
    model: torch.nn.Module,
    logits_of: Callable[[torch.Tensor], torch.Tensor],
    *,
    seed: int,
    vocab_size: int,
    seq_len: int,
    batch_size: int,
    device: torch.device,
) -> Callable[[], torch.Tensor]:
    """A workload's ``eval_losses``: the mean next-token loss of each of :data:`NUM_HELD_OUT`
    fixed sequences (``[NUM_HELD_OUT]``, float32), scored ``batch_size`` at a time in eval mode
    and under the step's autocast.

    The sequences depend only on the seed and the shapes (drawn on the CPU, then moved), so both
    sides of an A/B, and a CPU and a GPU run, score the same examples; they are drawn on the first
    call. ``logits_of(ids [B, T])`` returns the logits ``[B, T, V]``.
    """
    held_out: list[torch.Tensor] = []

    def eval_losses() -> torch.Tensor:
        if not held_out:
            generator = torch.Generator().manual_seed(seed + HELD_OUT_SEED_OFFSET)
            tokens = torch.randint(0, vocab_size, (NUM_HELD_OUT, seq_len + 1), generator=generator)
            held_out.append(tokens.to(device))
        was_training = model.training
        model.eval()
        losses = []
        try:
            with torch.no_grad(), autocast(device):
                for chunk in held_out[0].split(batch_size):
                    logits_btv = logits_of(chunk[:, :-1])
                    loss_bt = F.cross_entropy(
                        logits_btv.flatten(0, 1).float(), chunk[:, 1:].flatten(), reduction="none"
                    )
                    losses.append(loss_bt.view(len(chunk), -1).mean(dim=1))
        finally:
            model.train(was_training)
        return torch.cat(losses)

    return eval_losses


# --- does the step fit the machine it is about to run on? ---------------------------------------

# copies of every parameter a step holds in the parameter dtype: the weight, its gradient and
# AdamW's two moments
COPIES_PER_PARAMETER = 4


@dataclass(frozen=True)
class StepFloor:
    """What one training step of a built-in holds at the least, counted from its shapes alone:
    a lower bound (the attention's scores, the MLP's intermediates and the allocator's slack are
    left out), so a step over it cannot run, while one under it may still not."""

    parameters: int  # the weight matrices counted: embedding, attention and MLP projections
    batch_bytes: int  # the step's batch: its token ids (int64), or its images' pixels
    kept_per_block: int  # activations each block keeps for backward, at the least: its input
    num_blocks: int
    logits: int  # elements of the output logits, for a language model (0 otherwise)

    def bytes(self, param_size: int, activation_size: int) -> int:
        return (
            COPIES_PER_PARAMETER * self.parameters * param_size
            + self.batch_bytes
            + self.num_blocks * self.kept_per_block * activation_size
            + self.logits * activation_size
        )


def check_step_fits(
    label: str, floor: StepFloor, device: torch.device, param_dtype: torch.dtype, smaller: str
) -> None:
    """Refuse, before building, a step whose least memory exceeds the device it would run on
    (``label``: the parameters that set its size, as the message shows them):
    the build or the first step would fail on an allocation, after minutes. Under levers
    memory's fake tensors nothing is allocated and its prediction says whether the step fits, so
    nothing is refused there. ``smaller`` says which parameters to lower.

    Raises:
        ValueError: the step's floor is over the device's memory.
    """
    if torch._guards.detect_fake_mode() is not None:  # levers memory: shapes, no allocation
        return
    capacity, where = device_memory(device)
    # under bf16 autocast on a GPU the activations are bf16; on a CPU the step runs in its dtype
    param_size = param_dtype.itemsize
    activation_size = 2 if device.type == "cuda" else param_size
    need = floor.bytes(param_size, activation_size)
    if capacity is None or need <= capacity:
        return
    raise ValueError(
        f"one training step at {label} holds at least {format_bytes(need)} (its weights, "
        "gradients and AdamW state, the batch, each block's saved input and the logits), more "
        f"than the {format_bytes(capacity)} of {where}: it would fail on an allocation after "
        f"running for a while; lower {smaller} (levers memory predicts the step's peak on a GPU "
        "without allocating it)"
    )


def device_memory(device: torch.device) -> tuple[int | None, str]:
    """The memory of ``device`` in bytes (the host's physical memory for a CPU), and its name;
    None where it cannot be read."""
    if device.type == "cuda":
        if not torch.cuda.is_available():
            return None, "the GPU"
        props = torch.cuda.get_device_properties(device)
        return int(props.total_memory), props.name
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "this host"
    except (AttributeError, ValueError, OSError):  # no sysconf (Windows)
        return None, "this host"
