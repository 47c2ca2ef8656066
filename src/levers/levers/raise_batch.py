"""``raise-batch``: build the step with the largest batch that fits the GPU with a margin.

It acts on the workload's factory parameters, not on a built model: the batch size comes from
levers memory's fit (the same bisection as ``levers memory --fit batch_size``: predicted on fake
tensors, the reserved peak against the GPU's usable memory less the margin), with the other
levers of the run applied to the predicted step, since they change its memory (except
compile-blocks and liger-kernels, which cannot run on fake tensors; the chunked loss stands in for
a fused one). ``levers ab
WORKLOAD --lever raise-batch`` builds the candidate with the chosen ``batch_size`` and says which.

Options: ``gpu`` (a name or budget levers memory knows; default the current CUDA device),
``margin`` (0.05), ``max_batch_size`` (cap of the search), ``max_evaluations`` (predictions
the search may make, 16; the best fit so far stands when they run out), ``levers`` (ids applied
while predicting).

Fix safety: changes numerics, and more: another batch size is another training step (the
optimizer sees other gradients per step; tune the learning rate if it matters). No parity
tolerance applies; run ``levers ab`` with ``--parity-steps 0``.
"""

from __future__ import annotations

from typing import Any, Callable

from levers.levers import register
from levers.levers.lever import Lever, Target
from levers.vocab import CHANGES_NUMERICS

DEFAULT_MARGIN = 0.05
PARAM = "batch_size"
# left out of the predicted step: compiling under fake tensors is slow and changes little of the
# peak, and Triton kernels cannot run on fake tensors (the chunked loss stands in for Liger's)
NOT_PREDICTED = ("compile-blocks", "liger-kernels", "raise-batch")


def _gpu(options: dict[str, Any]):
    from levers.hardware import gpu_from_device_name, resolve_gpu

    if options.get("gpu"):
        return resolve_gpu(options["gpu"])
    import torch

    if not torch.cuda.is_available():
        raise ValueError(
            "raise-batch fits the batch to the GPU it runs on, and there is none here: run on a "
            "GPU, or predict the fit without one with levers memory WORKLOAD --gpu h200 --fit "
            "batch_size (from Python: the lever option gpu='h200' or a budget such as '40GiB')"
        )
    spec = gpu_from_device_name(torch.cuda.get_device_name())
    if spec is None:
        free, total = torch.cuda.mem_get_info()  # sync point: once, before the search
        spec = resolve_gpu(f"{total / 2**30:.1f}GiB")
    return spec


def choose_params(
    spec: Any, params: dict[str, Any], options: dict[str, Any]
) -> tuple[dict[str, Any], str]:
    """The parameters with the largest fitting batch size, and a sentence saying what it chose."""
    from levers.memory.fit import MAX_EVALUATIONS, search_largest
    from levers.memory.plan import FitPoint
    from levers.memory.predict import run_prediction, source_of

    gpu = _gpu(options)
    margin = float(options.get("margin", DEFAULT_MARGIN))
    # the prediction is of the GPU run: a device given for this machine (device=cpu) is dropped,
    # so the factory gets the GPU the memory model stands in for
    source = source_of(spec, {k: v for k, v in params.items() if k != "device"})
    lever_ids = [i for i in options.get("levers", ()) if i not in NOT_PREDICTED]
    budget = int(gpu.usable_bytes * (1.0 - margin))

    def transform(workload) -> None:
        from levers.levers.handle import apply_to_workload

        apply_to_workload(workload, lever_ids, quiet=True, kernel="chunked")

    def evaluate(value: int) -> FitPoint:
        prediction = run_prediction(
            source.with_params(**{PARAM: value}), gpu, num_steps=1,
            transform=transform if lever_ids else None,
        )
        peak = prediction.replay.peak_reserved_bytes
        return FitPoint(
            value=value,
            peak_allocated_bytes=prediction.replay.peak_allocated_bytes,
            peak_reserved_bytes=peak,
            fits=peak <= budget,
        )

    if params.get(PARAM):
        start = int(params[PARAM])
    else:  # the factory's default, as the prediction records it
        start = int(run_prediction(source, gpu, num_steps=1).params.get(PARAM) or 1)
    upper = options.get("max_batch_size")
    best, curve = search_largest(
        evaluate,
        start,
        upper=int(upper) if upper else None,
        max_evaluations=int(options.get("max_evaluations", MAX_EVALUATIONS)),
    )
    if best is None:
        return dict(params), f"raise-batch: even {PARAM}=1 is predicted not to fit {gpu.name}"
    peak = next(p.peak_reserved_bytes for p in curve if p.value == best)
    with_levers = f" with {', '.join(lever_ids)}" if lever_ids else ""
    said = (
        f"raise-batch: {PARAM} {start} -> {best} (predicted reserved peak{with_levers} "
        f"{peak / 2**30:.1f} GiB of {budget / 2**30:.1f} GiB: {gpu.name} less {margin:.0%})"
    )
    return {**params, PARAM: best}, said


def applies(target: Target) -> str | None:
    return (
        "raise-batch acts on the workload's factory parameters, not a built model: use "
        "levers ab WORKLOAD --lever raise-batch, or levers memory WORKLOAD --fit batch_size"
    )


def patch(target: Target) -> Callable[[], None]:
    raise AssertionError("raise-batch is applied through choose_params")


LEVER = register(
    Lever(
        options=("gpu", "margin", "max_batch_size", "max_evaluations"),
        id="raise-batch",
        title="Raise the batch to the largest that fits the GPU with a 5% margin",
        safety=CHANGES_NUMERICS,
        fixes=("MEM003",),
        applies=applies,
        patch=patch,
        needs_gpu=True,
        runs_on_cpu=False,  # it fits the batch to the CUDA device it runs on
        choose_params=choose_params,
        known_problems="another batch size is another training step; parity cannot gate it",
    )
)
