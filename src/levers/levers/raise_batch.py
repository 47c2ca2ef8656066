"""``raise-batch``: build the step with the largest batch that fits the GPU with a margin.

It acts on the workload's factory parameters, not on a built model: the batch size comes from
levers memory's fit (the same bisection as ``levers memory --fit batch_size``: predicted on fake
tensors over as many steps as ``levers memory`` runs, so the optimizer's state, made in the
first step, is alive in a later step's backward; the reserved peak against the GPU's usable
memory less the margin), with the other levers of the run applied to the predicted step, since
they change its memory (except liger-kernels, whose Triton kernels cannot run on fake tensors).
The fused linear cross-entropy is predicted with the kernel the run will use: where Liger Kernel
is installed, a stand-in that makes Liger's allocations (:mod:`levers.levers._lce`), else the
chunked loss. compile-blocks and compile-model are predicted compiled: each graph partitioned as
inductor partitions it (min-cut rematerialization, on the fakes; :mod:`levers.memory.compiled`),
which is what frees a compiled step's activations (the HF llama 1b at batch 4 on an H200: 29.47
GiB allocated eager, 24.09 GiB compiled per block). ``levers ab WORKLOAD --lever raise-batch``
builds the candidate with the chosen ``batch_size`` and says which.

Options: ``gpu`` (a name or budget levers memory knows; default the current CUDA device),
``margin`` (0.05), ``max_batch_size`` (cap of the search), ``max_evaluations`` (predictions
the search may make, 24; the best fit so far stands, said "at least", when they run out),
``param`` (the factory's batch parameter; default the first of ``batch_size``, ``batch``,
``bs``, ``per_device_train_batch_size``, ``micro_batch_size``, ... in its signature),
``levers`` (ids applied while predicting), ``beside`` (the spec and parameters of a step that
holds the same GPU meanwhile: ``levers ab`` names its baseline, which stays alive while the
candidate steps; its predicted reserved peak is taken off the GPU's memory before the fit, so
the A/B measures a smaller batch than the step alone would fit, and says both). A batch
predicted for a GPU is never run on the host: with ``gpu=`` named and the candidate on the CPU,
it refuses before the search.

Fix safety: changes numerics, and more: another batch size is another training step (the
optimizer sees other gradients per step; tune the learning rate if it matters). No parity
tolerance applies; run ``levers ab`` with ``--parity-steps 0``.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable

import torch

from levers.hardware import gpu_from_device_name, resolve_gpu
from levers.levers import register
from levers.levers._option_values import count
from levers.levers.handle import apply_to_workload
from levers.levers.lever import Lever, Target, lever_id_of
from levers.loader import resolve_factory
from levers.memory.steps import DEFAULT_NUM_STEPS
from levers.vocab import CHANGES_NUMERICS

ID = "raise-batch"
PARAM = "batch_size"


def _margin(options: dict[str, Any]) -> float:
    from levers.memory.predict import DEFAULT_MARGIN, check_margin

    raw = options.get("margin", DEFAULT_MARGIN)
    try:
        return check_margin(float(raw))
    except (TypeError, ValueError):
        raise ValueError(
            f"{ID}: margin={raw!r} is not a share of the GPU's memory in [0, 1), e.g. 0.05"
        ) from None


def check(options: dict[str, Any]) -> None:
    """The options that can be read without a GPU or the step: the GPU named, the margin, the
    counts."""
    if options.get("gpu"):
        resolve_gpu(options["gpu"], option=f"{ID}: gpu")
    _margin(options)
    for key in ("max_batch_size", "max_evaluations"):
        if options.get(key) is not None:
            count(ID, key, options[key])


def _gpu(options: dict[str, Any]):
    if options.get("gpu"):
        return resolve_gpu(options["gpu"], option=f"{ID}: gpu")

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


# the names factories give their batch parameter, in the order they are looked for
BATCH_PARAMS = (
    "batch_size",
    "batch",
    "bs",
    "per_device_train_batch_size",
    "micro_batch_size",
    "train_batch_size",
    "micro_batch",
    "mbs",
    "batch_size_per_device",
)


def batch_param(spec: Any, options: dict[str, Any]) -> str:
    """The factory's batch parameter: ``param=NAME`` when given, else the first of
    :data:`BATCH_PARAMS` in its signature."""
    factory = resolve_factory(spec) if isinstance(spec, str) else spec
    try:
        parameters = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        parameters = {}
    names = [n for n, p in parameters.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    takes_any = any(p.kind is p.VAR_KEYWORD for p in parameters.values())
    listed = ", ".join(names) or "none"
    label = spec if isinstance(spec, str) else getattr(spec, "__name__", "the factory")
    named = options.get("param")
    if named:
        if named in names or takes_any:
            return str(named)
        raise ValueError(
            f"raise-batch:param={named}: {label} takes no parameter {named!r} (its parameters: "
            f"{listed}); name its batch parameter with raise-batch:param=NAME"
        )
    for name in BATCH_PARAMS:
        if name in names:
            return name
    raise ValueError(
        f"raise-batch found no batch parameter in {label}'s signature (looked for "
        f"{', '.join(BATCH_PARAMS)}; its parameters: {listed}); name it with "
        "raise-batch:param=NAME"
    )


def _runs_on_host(params: dict[str, Any]) -> bool:
    """The built side runs on this machine's CPU (not a CUDA device)."""
    device = params.get("device")
    if device is not None:
        return not str(device).startswith("cuda")

    return not torch.cuda.is_available()


def choose_params(
    spec: Any, params: dict[str, Any], options: dict[str, Any]
) -> tuple[dict[str, Any], str]:
    """The parameters with the largest fitting batch, and a sentence saying what it chose.

    Raises:
        ValueError: no GPU here and none named; a GPU named while the side would run on the
            host (a batch predicted for a GPU is never run on the CPU); no batch parameter.
    """
    gpu = _gpu(options)
    param = batch_param(spec, options)
    if _runs_on_host(params):
        name = spec if isinstance(spec, str) else "WORKLOAD"
        raise ValueError(
            f"raise-batch picks {param} for {gpu.name} (gpu={options.get('gpu')}), but the "
            "candidate would run here, on the CPU, where a batch sized for that GPU's memory "
            "does not fit: run levers ab on that GPU, or predict the batch without running it: "
            f"levers memory {name} --gpu {options.get('gpu')} --fit {param}"
        )
    return fit_batch(spec, params, options, gpu=gpu, param=param)


def _gpu_source(spec: Any, params: dict[str, Any]) -> Any:
    """The source of a prediction of the GPU run: a device given for this machine (device=cpu)
    is dropped, so the factory gets the GPU the memory model stands in for."""
    # the memory model, imported when the lever predicts (levers.levers)
    from levers.memory.predict import source_of

    return source_of(spec, {k: v for k, v in params.items() if k != "device"})


def _held_beside(beside: Any, gpu: Any) -> int:
    """The predicted reserved peak of the step ``beside`` ((spec, parameters)) on ``gpu``; 0
    when none is named."""
    if not beside:
        return 0
    # the memory model, imported when the lever predicts (levers.levers)
    from levers.memory.predict import run_prediction

    spec, params = beside
    try:
        prediction = run_prediction(_gpu_source(spec, params), gpu, num_steps=DEFAULT_NUM_STEPS)
    except Exception as exc:  # noqa: BLE001 - said as the lever's refusal, with the cause
        cause = (str(exc).splitlines() or [""])[0]
        raise ValueError(
            f"the step beside it (the A/B's baseline) could not be predicted, so the room it "
            f"leaves is unknown ({type(exc).__name__}: {cause}); run the candidate at a batch "
            "of your choosing with --set-b batch_size=N"
        ) from exc
    return int(prediction.replay.peak_reserved_bytes)


def fit_batch(
    spec: Any,
    params: dict[str, Any],
    options: dict[str, Any],
    *,
    gpu: Any = None,
    param: str | None = None,
) -> tuple[dict[str, Any], str]:
    """The fit :func:`choose_params` applies, without the check of where the side runs."""
    # the memory model, imported when the lever predicts (levers.levers)
    from levers.memory.fit import MAX_EVALUATIONS, fit_param
    from levers.memory.predict import MemoryOptions, run_prediction
    from levers.memory.prediction import NOT_PREDICTED

    gpu = gpu if gpu is not None else _gpu(options)
    param = param or batch_param(spec, options)
    margin = _margin(options)
    held = _held_beside(options.get("beside"), gpu)
    whole = gpu
    if held:
        if held >= gpu.total_bytes:
            return dict(params), (
                f"raise-batch: the step beside it (the A/B's baseline) is predicted to reserve "
                f"{held / 2**30:.1f} GiB, all of {gpu.name}: the batch stays as it is"
            )
        gpu = dataclasses.replace(gpu, total_bytes=gpu.total_bytes - held)
    source = _gpu_source(spec, params)
    lever_ids = [i for i in options.get("levers", ()) if i not in NOT_PREDICTED]
    skipped: dict[str, str] = {}  # the levers that did not apply to the predicted step, and why

    def transform(workload) -> None:
        # the fused loss's kernel is the run's own (kernel=auto unless its spec names one): the
        # prediction runs on the machine that will run the step, so auto finds the same kernel
        skipped.update(apply_to_workload(workload, lever_ids, quiet=True).skipped)

    if params.get(param):
        start = int(params[param])
    else:  # the factory's default, as the prediction records it
        start = int(run_prediction(source, gpu, num_steps=1).params.get(param) or 1)
    upper = options.get("max_batch_size")
    fit = fit_param(
        source, MemoryOptions(gpu=gpu, margin=margin, num_steps=DEFAULT_NUM_STEPS), param,
        start=start, upper=count(ID, "max_batch_size", upper) if upper else None,
        max_evaluations=count(
            ID, "max_evaluations", options.get("max_evaluations", MAX_EVALUATIONS)
        ),
        transform=transform if lever_ids else None,
    )
    if fit.best is None:
        return dict(params), f"raise-batch: even {param}=1 is predicted not to fit {gpu.name}"
    if held:
        beside = (
            f"; the A/B's baseline, beside it on the GPU, is predicted to reserve "
            f"{held / 2**30:.1f} GiB, so this batch is smaller than the step alone would fit "
            f"(levers memory --gpu {whole.name} --fit {param} says that one)"
        )
    else:
        beside = ""
    peak = next(p.peak_reserved_bytes for p in fit.curve if p.value == fit.best)
    predicted = [i for i in lever_ids if lever_id_of(i) not in skipped]
    with_levers = f" with {', '.join(predicted)}" if predicted else ""
    said = (
        f"raise-batch: {param} {start} -> {fit.best} (predicted reserved peak{with_levers} "
        f"{peak / 2**30:.1f} GiB of {fit.budget_bytes / 2**30:.1f} GiB: {gpu.name} less "
        f"{margin:.0%}{' and the baseline' if held else ''}; largest that fits: "
        f"{fit.statement()}){beside}"
    )
    if skipped:
        left_out = "; ".join(f"{lever_id} ({why})" for lever_id, why in skipped.items())
        said += f"; not in the prediction: {left_out}"
    return {**params, param: fit.best}, said


def applies(target: Target) -> str | None:
    return (
        "raise-batch acts on the workload's factory parameters, not a built model: use "
        "levers ab WORKLOAD --lever raise-batch, or levers memory WORKLOAD --fit batch_size"
    )


def patch(target: Target) -> Callable[[], None]:
    raise AssertionError("raise-batch is applied through choose_params")


LEVER = register(
    Lever(
        options=("gpu", "margin", "max_batch_size", "max_evaluations", "param"),
        check=check,
        id=ID,
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
