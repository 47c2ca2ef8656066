"""``predict_memory``: the peak GPU memory of a workload's training step, predicted on any
machine (no GPU needed), attributed, and checked against a GPU's capacity.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from levers.hardware import DEFAULT_GPU, GpuSpec
from levers.memory.distributed import predict_per_rank
from levers.memory.options import (  # noqa: F401 - DEFAULT_MARGIN and check_margin re-exported
    DEFAULT_MARGIN,
    MemoryOptions,
    check_margin,
)
from levers.memory.plan import MemoryPlan
from levers.memory.prediction import (  # noqa: F401 - the prediction's names, re-exported
    Prediction,
    Source,
    assumptions_of,
    plan_from,
    run_prediction,
    source_of,
)
from levers.memory.whatif import all_whatifs
from levers.options import options_or_keywords
from levers.workload import Workload


def predict_memory(
    workload_or_factory: Any,
    gpu: str | GpuSpec = DEFAULT_GPU,
    *,
    params: dict[str, Any] | None = None,
    margin: float | None = None,
    num_steps: int | None = None,
    whatifs: bool = False,
    transform: Callable[[Workload], None] | None = None,
    options: MemoryOptions | None = None,
) -> MemoryPlan:
    """Predict the peak GPU memory of a training step without a GPU.

    Args:
        workload_or_factory: a workload spec (``"llama"``, ``"path/file.py:factory"``,
            ``"pkg.mod:factory"``) or a factory function returning a :class:`levers.Workload`.
        gpu: a GPU name (``h100-80gb``, ``h200``, ``a100-80gb``, ``a100-40gb``), a budget such
            as ``"40GiB"``, or a :class:`GpuSpec`.
        params: keyword arguments for the factory (``device`` defaults to ``"cuda"``).
        margin: the fraction of usable memory to keep free when judging whether it fits
            (None: 0.05).
        num_steps: training steps to run after the build; peaks are over the whole run (None:
            :data:`levers.memory.steps.DEFAULT_NUM_STEPS`).
        whatifs: also predict the what-ifs (activation checkpointing, bf16 and 8-bit optimizer
            states, loss over valid rows, SDPA), each a full or partial re-prediction.
        transform: changes the built workload before its first step, in this prediction and
            every what-if's (the levers of ``levers memory --lever``; a compiled module is
            predicted compiled: :mod:`levers.memory.compiled`).
        options: ``gpu`` .. ``whatifs`` as one :class:`levers.memory.options.MemoryOptions`
            (:meth:`levers.Step.memory` passes it; with a ``world_size``, one rank's plan), in
            place of those keywords.

    Returns:
        A :class:`MemoryPlan` with the predicted ``max_memory_allocated`` and
        ``max_memory_reserved``, their attribution and the moment of the peak.

    Raises:
        ValueError: an unknown GPU, a margin outside [0, 1), fewer than one step.
        TypeError: ``options`` with one of the keywords it replaces.
    """
    options = options_or_keywords(
        "predict_memory", options, MemoryOptions.checked,
        dict(gpu=gpu, margin=margin, num_steps=num_steps, whatifs=whatifs),
    )
    return predict_source(source_of(workload_or_factory, params, transform), options)


def predict_source(source: Source, options: MemoryOptions) -> MemoryPlan:
    """The plan of ``source``: one prediction, the what-ifs when asked, and with a world size
    the peak of each rank in ``extra["per_rank"]``."""
    if options.world_size is None:
        prediction = run_prediction(source, options.gpu, num_steps=options.num_steps)
        plan = plan_from(prediction, options.gpu, options.margin)
    else:
        prediction, plan, rank = predict_per_rank(source, options)
        plan = replace(plan, extra={**plan.extra, "per_rank": rank.to_dict()})
    if options.whatifs:
        whatifs = all_whatifs(source, options.gpu, prediction, num_steps=options.num_steps)
        plan = replace(plan, whatifs=whatifs)
    return plan
