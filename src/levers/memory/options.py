"""What the user asks of one memory prediction, declared once.

``levers memory``'s flags, :meth:`levers.Step.memory`'s and :meth:`levers.Step.fit`'s keywords
and :func:`levers.predict_memory`'s become one :class:`MemoryOptions` at the border
(:meth:`MemoryOptions.checked`: the GPU name resolved to its spec, the margin, the steps, the
ranks and how they share the model checked before the workload is built), and the record is
passed whole to the prediction (:func:`levers.memory.predict.predict_source`), the per-rank
prediction (:func:`levers.memory.distributed.predict_per_rank`) and the fit
(:func:`levers.memory.fit.fit_param`).

The levers a prediction applies are not in it: they change the workload (a transform of the
:class:`levers.memory.prediction.Source`), and the lever catalogue sits above the memory model.
"""

from __future__ import annotations

from dataclasses import dataclass

from levers.hardware import DEFAULT_GPU, GPUS, GpuSpec, resolve_gpu
from levers.memory.distributed import STRATEGIES
from levers.memory.steps import DEFAULT_NUM_STEPS

DEFAULT_MARGIN = 0.05
DEFAULT_STRATEGY = STRATEGIES[0]  # ddp


def check_margin(margin: float) -> float:
    if not 0.0 <= margin < 1.0:
        raise ValueError(f"margin must be in [0, 1), got {margin!r}; e.g. 0.05 keeps 5% free")
    return float(margin)


def _count(value: int, option: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{option} must be at least 1, got {value!r}")
    return value


@dataclass(frozen=True)
class MemoryOptions:
    """One prediction's options.

    ``gpu``: the GPU (or plain memory budget) the step is predicted for, resolved. ``margin``:
    the fraction of its usable memory kept free when judging a fit. ``num_steps``: the training
    steps run after the build; the peaks are over all of them. ``whatifs``: also predict the
    what-ifs (:mod:`levers.memory.whatif`). ``world_size``: also predict one rank of that many
    data-parallel ranks sharing the model by ``strategy`` (``ddp``, ``zero1``, ``fsdp2``); None:
    one process, and no strategy.
    """

    gpu: GpuSpec = GPUS[DEFAULT_GPU]
    margin: float = DEFAULT_MARGIN
    num_steps: int = DEFAULT_NUM_STEPS
    whatifs: bool = False
    world_size: int | None = None
    strategy: str | None = None

    @classmethod
    def checked(
        cls,
        *,
        gpu: str | GpuSpec = DEFAULT_GPU,
        margin: float | None = None,
        num_steps: int | None = None,
        whatifs: bool = False,
        world_size: int | None = None,
        strategy: str | None = None,
    ) -> MemoryOptions:
        """The record of what the user gave, each value checked; None takes the default (a
        ``strategy`` of None with a ``world_size``: ddp).

        Raises:
            ValueError: an unknown GPU (or unreadable budget), a margin outside [0, 1), fewer
                than one step or rank, an unknown strategy, or a strategy without a world size;
                the message says what to pass instead.
        """
        spec = resolve_gpu(gpu, option="--gpu")
        margin = check_margin(DEFAULT_MARGIN if margin is None else margin)
        num_steps = _count(DEFAULT_NUM_STEPS if num_steps is None else num_steps, "--predict-steps")
        if world_size is None:
            if strategy is not None:
                raise ValueError(
                    "--strategy needs --world-size N (the number of data-parallel ranks)"
                )
            return cls(spec, margin, num_steps, whatifs)
        if strategy is not None and strategy not in STRATEGIES:
            raise ValueError(
                f"--strategy {strategy!r} is not known; use one of {', '.join(STRATEGIES)}"
            )
        return cls(
            spec, margin, num_steps, whatifs, _count(world_size, "--world-size"),
            strategy or DEFAULT_STRATEGY,
        )
