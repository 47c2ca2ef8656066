"""Sweep: every lever's contract on every architecture the ``arch`` workload can build, on a CPU.

    # every transformers architecture (causal LM, masked LM, seq2seq LM, image classification)
    PYTHONPATH=src python bench/arch_sweep.py --library transformers \
        --out bench/results/arch_sweep_cpu
    # one timm model per timm module (the smallest by parameters), in a venv with timm
    PYTHONPATH=src python bench/arch_sweep.py --library timm --out bench/results/arch_sweep_cpu
    # a seeded sample, a few levers, some architectures by name
    PYTHONPATH=src python bench/arch_sweep.py --sample 20 --seed 1 --levers compile-blocks,ac-full
    PYTHONPATH=src python bench/arch_sweep.py --only opt,bart/seq2seq,timm:resnet18
    python bench/arch_sweep.py --list

Architectures are ``model/task`` (``bart/seq2seq``; ``timm:<name>`` for timm), from
transformers' four auto mappings (:func:`levers.workloads.arch.architectures`) and timm's
registry. timm has ~1,400 models in ~100 modules (families); the sweep takes one per module, the
one with the fewest parameters at timm's defaults (counted on the meta device), so that the
sweep stays at a few hundred models: ``--timm-all`` takes every one.

Each architecture is built at ``size=tiny`` in a fresh worker process (a crash, a hang or a
leaked global cannot reach the next one; ``--timeout-s`` per architecture) and, for each lever
of the catalogue (:func:`levers.levers.load_all`; ``--levers`` picks), the contract runs
(:func:`contract`):

1. ``applies``: ``None`` or the lever's reason, recorded; a lever that refuses to run without a
   CUDA device (``runs_on_cpu=False``) is skipped with that reason, as are the levers on the
   factory's parameters (raise-batch). Levers whose speed-up needs a GPU (``needs_gpu``) still
   run: their contract holds on a CPU. A lever that applies and then refuses in its own words
   while patching (a ``ValueError`` that starts with its id: ac-budget finds no plan under the
   budget) is recorded as ``refused``, apart from the errors.
2. parity: the parity gate of ``levers ab`` (:func:`levers.ab.parity.run_parity`) over
   ``--parity-steps`` steps of a never-patched build against a patched one, both from one seed:
   an ``exact`` lever bitwise-close to the baseline, a numerics-changing one against the float64
   run of the baseline (made once per architecture), with the lever's declared parity floor; a
   failed gate runs the baseline again from the same seed, as ``levers ab`` does
   (:mod:`levers.ab.repeat`). The verdict is ``levers ab``'s parity read: PARITY, DAMAGED or
   NOT_MEASURED, with the numbers.
3. undo: after the parity steps the lever is undone and the model must be as the never-patched
   baseline is after the same steps: the same module classes and attributes, the config, the
   optimizer's attributes and hyperparameters, its own step function, no compiled call left;
   and it must compute as a model that was never patched: its weights loaded into the
   never-patched baseline, one more step of each gives bitwise the same loss and gradients.
   Then a second pair, patched and undone before any step, against a twin: bitwise the same
   loss, gradients and updated parameters.

On a CPU the compile levers trace without inductor (compile-blocks and compile-loss ``aot_eager``,
compile-model ``eager``, as ``tests/zoo`` runs them), ``ac-budget`` plans for 90% of the activations predicted
for this very workload (``budget=0.9:workload=arch``) and the fused loss uses its chunked kernel.

Writes ``OUT/results.jsonl`` (one row per architecture and lever, plus one ``lever: null`` row
per architecture for its build; the rows of the architectures and levers run again replace
theirs, so a new lever is swept alone) and
``OUT/summary.md`` (the counts, failures grouped). Each row carries the git commit, torch,
transformers and timm versions, so rows from two environments sit in one file. timm imports
torchvision, whose compiled operators PyPI's wheel (built for a CUDA torch) cannot load beside a
CPU torch: the sweep sets ``LEVERS_TORCHVISION_WITHOUT_OPS=1`` (``levers.optional.import_timm``;
timm's models call none of those operators) unless told otherwise.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import gc
import json
import os
import platform
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path
from typing import Any, Callable

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
os.environ.setdefault("LEVERS_TORCHVISION_WITHOUT_OPS", "1")  # see the docstring's end

import levers  # noqa: E402
from levers.ab.killlines import KillLines  # noqa: E402
from levers.ab.parity import reference_for, run_parity  # noqa: E402
from levers.ab.reads import parity_read  # noqa: E402
from levers.ab.repeat import check_repeatable  # noqa: E402
from levers.ab.rounding import check_rounding  # noqa: E402
from levers.ab.reference import Reference  # noqa: E402
from levers.environment import levers_commit_id  # noqa: E402
from levers.levers import load_all  # noqa: E402
from levers.levers._patch import set_attr  # noqa: E402
from levers.levers.lever import Lever, target_of  # noqa: E402
from levers.optional import import_timm, torchvision_without_ops  # noqa: E402
from levers.output.atomic import atomic_write_text  # noqa: E402
from levers.vocab import CHANGES_NUMERICS  # noqa: E402
from levers.workload import Workload  # noqa: E402
from levers.workloads import arch  # noqa: E402

torchvision_without_ops()  # before transformers imports torchvision

# the options each lever runs with on a CPU (see the module docstring)
CPU_OPTIONS: dict[str, dict[str, Any]] = {
    "compile-blocks": {"backend": "aot_eager"},
    "compile-model": {"backend": "eager"},
    "compile-loss": {"backend": "aot_eager"},
    "ac-budget": {"budget": "1.0", "workload": "arch"},
    "fused-linear-cross-entropy": {"kernel": "chunked"},
}
PARITY_STEPS = 3
TIMEOUT_S = 1200.0
SEED = 0
TIMM = "timm:"


# --- the contract of one lever on one architecture -----------------------------------------------


def _short(exc: BaseException, limit: int = 400) -> str:
    text = f"{type(exc).__name__}: {exc}".strip().splitlines()
    first = text[0] if text else type(exc).__name__
    return first if len(first) <= limit else first[: limit - 3] + "..."


def _where(exc: BaseException) -> str:
    """The innermost frame of the traceback inside levers or the model's library."""
    frames = traceback.extract_tb(exc.__traceback__)
    for frame in reversed(frames):
        if any(part in frame.filename for part in ("/levers/", "transformers/", "timm/")):
            return f"{Path(frame.filename).name}:{frame.lineno}"
    return f"{Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else ""


def seeded(build: Callable[[], Workload], seed: int = SEED) -> Workload:
    torch.manual_seed(seed)
    return build()


def snapshot(workload: Workload) -> dict[str, Any]:
    """What an undo must put back, in comparable form: module classes and attribute names, the
    config, the optimizer's attribute names and hyperparameters."""
    model, optimizer = workload.model, workload.optimizer
    config = getattr(model, "config", None)
    return {
        "classes": {name: type(m).__name__ for name, m in model.named_modules()},
        "attributes": {name: sorted(vars(m)) for name, m in model.named_modules()},
        "config": config.to_dict() if hasattr(config, "to_dict") else None,
        "optimizer_attributes": sorted(vars(optimizer)) if optimizer is not None else None,
        "optimizer_groups": [
            {k: repr(v) for k, v in group.items() if k != "params"}
            for group in (optimizer.param_groups if optimizer is not None else ())
        ],
    }


def _compiled(model: torch.nn.Module) -> list[str]:
    return [
        name or "the model"
        for name, m in model.named_modules()
        if getattr(m, "_compiled_call_impl", None) is not None
    ]


def restored(workload: Workload, expected: dict[str, Any], step: Callable[[], Any]) -> list[str]:
    """What the undo left changed (empty: nothing): against ``expected``, the snapshot of the
    same model never patched at the same point (a model sets some config fields and attributes
    in its first forward), and ``step``, the workload's own step."""
    after = snapshot(workload)
    problems = []
    if workload.step is not step:
        problems.append("the workload's step is not the original function")
    for key in expected:
        if after[key] != expected[key]:
            problems.append(f"{key} differ: {_first_difference(expected[key], after[key])}")
    compiled = _compiled(workload.model)
    if compiled:
        problems.append(f"compiled call left on {', '.join(compiled[:3])}")
    return problems


def _first_difference(a: Any, b: Any) -> str:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b), key=str):
            if a.get(key, "<absent>") != b.get(key, "<absent>"):
                before, after = a.get(key, "<absent>"), b.get(key, "<absent>")
                return f"{key}: {str(before)[:80]} -> {str(after)[:80]}"
    return f"{str(a)[:80]} -> {str(b)[:80]}"


def traced_step(workload: Workload, seed: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One step's loss and the gradients the optimizer sees, the global RNG at ``seed``."""
    names = {id(p): n for n, p in workload.model.named_parameters()}
    grads: dict[str, torch.Tensor] = {}
    optimizer = workload.optimizer
    original = optimizer.step

    def step(*args: Any, **kwargs: Any) -> Any:
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    grads[names.get(id(p), str(id(p)))] = p.grad.detach().clone()
        return original(*args, **kwargs)

    # an instance step a lever set (the optimizer-state levers) is put back, not deleted
    undo = set_attr(optimizer, "step", step)
    try:
        torch.manual_seed(seed)
        loss = torch.as_tensor(workload.step()).detach().clone()
    finally:
        undo()
    return loss, grads


def bitwise_differences(a: Workload, b: Workload, seed: int, *, params: bool) -> list[str]:
    """Where one step of ``a`` and of ``b`` (same seed) differ bitwise."""
    loss_a, grads_a = traced_step(a, seed)
    loss_b, grads_b = traced_step(b, seed)
    problems = []
    if not torch.equal(loss_a, loss_b):
        problems.append(f"loss {float(loss_a)!r} vs never patched {float(loss_b)!r}")
    if grads_a.keys() != grads_b.keys():
        problems.append("the gradients name different parameters")
    else:
        differing = [n for n in grads_a if not torch.equal(grads_a[n], grads_b[n])]
        if differing:
            problems.append(f"{len(differing)} gradients differ ({differing[0]}, ...)")
    if params:
        state_a, state_b = a.model.state_dict(), b.model.state_dict()
        differing = [k for k in state_a if k in state_b and not torch.equal(state_a[k], state_b[k])]
        if differing or state_a.keys() != state_b.keys():
            problems.append(f"parameters after the step differ ({(differing or ['names'])[0]})")
    return problems


def check_undo_after_steps(candidate: Workload, baseline: Workload, seed: int) -> list[str]:
    """The undone candidate computes as the never-patched baseline does from its weights."""
    try:
        baseline.model.load_state_dict(candidate.model.state_dict())
    except Exception as exc:  # noqa: BLE001 - keys or shapes the undo did not put back
        return [f"its weights do not load into a never-patched model ({_short(exc, 200)})"]
    return bitwise_differences(candidate, baseline, seed + 1000, params=False)


def _applied(workload: Workload, lever: Lever, options: dict[str, Any]) -> Workload:
    """``workload`` with ``lever`` applied (the candidate's build, for its float64 run)."""
    levers.apply(workload, lever.id, **options)
    return workload


def check_undo_before_steps(build: Callable[[], Workload], lever: Lever,
                            options: dict[str, Any], seed: int) -> list[str]:
    """Patched and undone before any step: one step is bitwise a never-patched twin's."""
    patched, twin = seeded(build, seed), seeded(build, seed)
    before, step = snapshot(patched), patched.step
    levers.apply(patched, lever.id, **options).undo()
    problems = restored(patched, before, step)
    return problems + bitwise_differences(patched, twin, seed + 2000, params=True)


def contract(
    build: Callable[[], Workload],
    lever: Lever,
    options: dict[str, Any],
    *,
    reference: Callable[[], Reference],
    parity_steps: int = PARITY_STEPS,
    seed: int = SEED,
) -> dict[str, Any]:
    """applies -> apply -> parity -> undo for one lever on one architecture; a row's fields.

    ``reference()`` gives the float64 run of the baseline's parity steps (made once per
    architecture by the caller). Never raises for the lever's sake: what raised is the row's
    ``error``, with the stage it raised in.
    """
    row: dict[str, Any] = {"lever": lever.id, "safety": lever.safety, "options": options,
                           "applies": None, "refused": None, "parity": None, "undo_ok": None,
                           "undo_problems": [], "error": None, "error_stage": None}
    started = time.perf_counter()
    torch._dynamo.reset()
    stage = "applies"
    try:
        if not lever.runs_on_cpu:
            row["applies"] = "skipped on the CPU: the lever refuses to run without a CUDA device"
            row["skipped"] = True
            return row
        reason = lever.applies(target_of(seeded(build, seed), options))
        if reason is not None:
            row["applies"] = reason
            return row
        stage = "parity"
        ref = reference() if lever.safety == CHANGES_NUMERICS else None
        baseline, candidate = seeded(build, seed), seeded(build, seed)
        original_step = candidate.step
        stage = "apply"
        try:
            handle = levers.apply(candidate, lever.id, **options)
        except ValueError as exc:
            if not str(exc).startswith(f"{lever.id}:"):
                raise
            # the lever's own refusal, in its words (ac-budget: no plan fits the budget)
            row["refused"] = _short(exc)
            return row
        stage = "parity"
        result, kill = run_parity(
            baseline, candidate, num_steps=parity_steps, exactness=lever.safety, seed=seed,
            lines=KillLines(), reference=ref, floor=lever.parity_floor, floor_of=lever.id,
        )
        if kill is None:  # a failed gate: does the baseline repeat itself?
            result, kill = check_repeatable(lambda: seeded(build, seed), result, seed=seed,
                                            lines=KillLines())
        if kill is None:  # ... and is the difference the lever's math, or amplified rounding?
            result, kill = check_rounding(
                lambda: _applied(seeded(build, seed), lever, options), result,
                faithful=lever.float64_faithful, seed=seed, lines=KillLines(),
            )
        read = parity_read(result)
        row["parity"] = parity_record(result, read)
        if kill is not None:
            row["error"], row["error_stage"] = f"{kill.kind}: {kill.reason}"[:600], "parity"
        stage = "undo"
        handle.undo()
        problems = restored(candidate, snapshot(baseline), original_step)
        if not problems:
            problems = check_undo_after_steps(candidate, baseline, seed)
        del baseline, candidate, handle
        problems += [f"before any step: {p}" for p in
                     check_undo_before_steps(build, lever, options, seed)]
        row["undo_ok"], row["undo_problems"] = not problems, problems
    except Exception as exc:  # noqa: BLE001 - a raising lever is a result, not a crash
        row["error"], row["error_stage"] = f"{_short(exc)} [{_where(exc)}]", stage
    finally:
        row["seconds"] = round(time.perf_counter() - started, 2)
        gc.collect()
    return row


def parity_record(result: Any, read: Any) -> dict[str, Any]:
    return {
        "verdict": read.verdict,
        "note": read.note,
        "rule": result.rule,
        "rtol": [result.tolerance.rtol_first, result.tolerance.rtol_last],
        "num_steps": result.num_steps,
        "baseline_losses": list(result.baseline_losses),
        "candidate_losses": list(result.candidate_losses),
        "reference_losses": list(result.reference_losses),
        "repeat": result.repeat,
        "checks": [
            {k: getattr(c, k) for k in ("step", "quantity", "baseline", "candidate", "rel_diff",
                                         "passed", "rule", "candidate_error", "allowed_error")}
            for c in result.checks
        ],
    }


# --- one architecture (in a worker process) ------------------------------------------------------


def split_arch(name: str) -> tuple[str, str | None]:
    """``bart/seq2seq`` -> (bart, seq2seq); ``opt`` -> (opt, None); ``timm:x`` -> (timm:x, None)."""
    model, _, task = name.partition("/")
    return model, task or None


def builder(model: str, task: str | None) -> Callable[[], Workload]:
    return lambda: arch.build(model=model, task=task, size="tiny")


def run_architecture(name: str, lever_ids: list[str], parity_steps: int,
                     emit: Callable[[dict[str, Any]], None]) -> None:
    """The build row, then one row per lever, each passed to ``emit`` as soon as it is done."""
    model, task = split_arch(name)
    row: dict[str, Any] = {"lever": None, "built": False}
    started = time.perf_counter()
    try:
        task = arch.resolve_task(model, task)
        row["task"] = task
        build = builder(model, task)
        workload = seeded(build)
        row.update(
            family=arch.entry(model, task).family if not model.startswith(TIMM) else None,
            params_count=sum(p.numel() for p in workload.model.parameters()),
            model_class=type(workload.model).__name__,
            workload_params={k: v for k, v in workload.params.items() if k != "device"},
            tokens_per_step=workload.tokens_per_step,
        )
        loss = float(workload.step())
        row["loss"] = loss
        if loss != loss or loss in (float("inf"), float("-inf")):
            raise FloatingPointError(f"the first step's loss is {loss}")
        row["built"] = True
    except Exception as exc:  # noqa: BLE001 - an architecture that does not build is a result
        row["error"], row["where"] = _short(exc), _where(exc)
    row["seconds"] = round(time.perf_counter() - started, 2)
    emit({"arch": name, **row})
    if not row["built"]:
        return
    del workload
    registry = load_all()
    cached: list[Reference] = []

    def reference() -> Reference:
        if not cached:
            ref, _ = reference_for(lambda: seeded(build), num_steps=parity_steps,
                                   exactness=CHANGES_NUMERICS, seed=SEED)
            cached.append(ref)
        return cached[0]

    for lever_id in lever_ids:
        emit({"arch": name, "task": task, "lever": lever_id, "started": True})
        result = contract(build, registry[lever_id], CPU_OPTIONS.get(lever_id, {}),
                          reference=reference, parity_steps=parity_steps)
        emit({"arch": name, "task": task, "params_count": row["params_count"], **result})


def worker(name: str, lever_ids: list[str], parity_steps: int, rows_file: Path) -> int:
    # one thread: on a shared 2-core machine two intra-op threads spin against each other (a
    # tiny step took 3 s with two, 40 ms with one)
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    import logging

    logging.disable(logging.WARNING)  # transformers' and dynamo's chatter, per model
    with rows_file.open("a", encoding="utf-8") as out:
        def emit(row: dict[str, Any]) -> None:
            out.write(json.dumps(row, default=str) + "\n")
            out.flush()

        run_architecture(name, lever_ids, parity_steps, emit)
    return 0


# --- the architectures ---------------------------------------------------------------------------


def transformers_architectures() -> list[str]:
    rows = arch.architectures()
    several = collections.Counter(model for model, _ in rows)
    return [f"{model}/{task}" if several[model] > 1 else model for model, task in rows]


def timm_architectures(every: bool = False) -> list[tuple[str, str]]:
    """(``timm:<name>``, why this one): one per timm module, the fewest parameters."""
    timm = import_timm()

    chosen = []
    for module in timm.list_modules():
        names = sorted(timm.list_models(module=module))
        if not names:
            continue
        if every:
            chosen += [(f"{TIMM}{n}", f"every model of {module}") for n in names]
            continue
        counts = {n: _meta_params(n) for n in names}
        counted = {n: c for n, c in counts.items() if c is not None}
        pick = min(counted, key=lambda n: (counted[n], n)) if counted else names[0]
        why = (f"the smallest of {len(names)} in timm.models.{module} ({counted[pick] / 1e6:.2f}M "
               "parameters at timm's defaults)" if counted else
               f"the first of {len(names)} in timm.models.{module} (none builds on meta)")
        chosen.append((f"{TIMM}{pick}", why))
    return chosen


def _meta_params(name: str) -> int | None:
    timm = import_timm()

    try:
        with torch.device("meta"):
            model = timm.create_model(name, pretrained=False)
        return sum(p.numel() for p in model.parameters())
    except Exception:  # noqa: BLE001 - a model that cannot be built on meta is not counted
        return None


def lever_ids(text: str | None) -> list[str]:
    registry = load_all()
    ids = sorted(i for i, lever in registry.items() if lever.choose_params is None)
    if not text:
        return ids
    wanted = [i.strip() for i in text.split(",") if i.strip()]
    unknown = [i for i in wanted if i not in registry]
    if unknown:
        raise SystemExit(f"--levers: unknown {', '.join(unknown)}; levers: {', '.join(ids)}")
    return wanted


# --- the parent: workers, rows, summary ----------------------------------------------------------


def versions() -> dict[str, Any]:
    def version(module: str) -> str | None:
        try:
            return __import__(module).__version__
        except Exception:  # noqa: BLE001 - not installed, or not importable beside this torch
            return None

    return {
        "commit": levers_commit_id() or "unknown",
        "torch": torch.__version__,
        "transformers": version("transformers"),
        "timm": version("timm"),
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def run_worker(name: str, ids: list[str], args: argparse.Namespace) -> list[dict[str, Any]]:
    """One architecture in a fresh process; its rows, with a timeout row if it ran out."""
    with tempfile.NamedTemporaryFile("r", suffix=".jsonl", delete=False) as tmp:
        rows_file = Path(tmp.name)
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", name,
               "--levers", ",".join(ids), "--parity-steps", str(args.parity_steps),
               "--rows-file", str(rows_file)]
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               start_new_session=True, text=True,
                               env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        _, stderr = process.communicate(timeout=args.timeout_s)
        ended = None if process.returncode == 0 else (
            f"the worker exited with {process.returncode}: {_last_line(stderr)}")
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # the worker we started, and its children
        process.communicate()
        ended = f"timeout: the architecture's {args.timeout_s:g}s were spent"
    lines = rows_file.read_text(encoding="utf-8").splitlines()
    rows_file.unlink()
    raw = [json.loads(line) for line in lines if line.strip()]
    rows = [r for r in raw if not r.get("started")]
    if ended is not None:
        done = {r["lever"] for r in rows}
        build = next((r for r in rows if r["lever"] is None), None)
        if build is None:
            rows.append({"arch": name, "lever": None, "built": False, "error": ended,
                         "seconds": round(time.perf_counter() - started, 2)})
        else:
            in_progress = [r["lever"] for r in raw if r.get("started") and r["lever"] not in done]
            for lever_id in ids:
                if lever_id in done:
                    continue
                error = ended if lever_id in in_progress else f"not run: {ended}"
                rows.append({"arch": name, "task": build.get("task"), "lever": lever_id,
                             "params_count": build.get("params_count"), "applies": None,
                             "parity": None, "undo_ok": None, "error": error,
                             "error_stage": "worker"})
    return rows


def _last_line(text: str) -> str:
    lines = [line for line in (text or "").splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no output"


def read_rows(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def pending(names: list[str], rows: list[dict[str, Any]], resume: bool,
            commands: list[str] | None = None) -> list[str]:
    """``names``, less those with rows already where the run resumes (``--resume``); with
    ``commands`` (bench/arch_commands.py's rows), less those with a row of each of them."""
    if not resume:
        return names
    if commands is None:
        done = {r["arch"] for r in rows}
    else:
        have: dict[str, set[str]] = {}
        for r in rows:
            have.setdefault(r["arch"], set()).add(r.get("command"))
        done = {arch for arch, seen in have.items() if set(commands) <= seen}
    return [n for n in names if n not in done]


def write_rows(path: Path, rows: list[dict[str, Any]]) -> None:
    atomic_write_text(path, "".join(json.dumps(r, default=str) + "\n" for r in rows))


def merged(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``old`` without the rows ``new`` ran again, then ``new``: an architecture's build row and
    the levers run again replace theirs, its other levers' rows are kept (a lever added to the
    catalogue is swept alone); an architecture that no longer builds keeps none of its rows."""
    again = {(r["arch"], r.get("lever")) for r in new}
    unbuilt = {r["arch"] for r in new if r.get("lever") is None and not r.get("built")}
    return [r for r in old if r["arch"] not in unbuilt
            and (r["arch"], r.get("lever")) not in again] + new


# --- summary -------------------------------------------------------------------------------------


def _reason_group(error: str) -> str:
    """An error grouped with its kind: numbers, names and paths dropped."""
    text = re.sub(r"'[^']*'|\"[^\"]*\"", "'...'", error)
    text = re.sub(r"\d+", "N", text)
    return text[:140]


def outcome(row: dict[str, Any]) -> str:
    """One word per lever row: skipped, not-applicable, refused, PARITY, DAMAGED, NOT_MEASURED,
    error."""
    if row.get("skipped"):
        return "skipped"
    if row.get("refused"):
        return "refused"
    if row.get("error") and row.get("parity") is None:
        return "error"
    if row.get("parity") is None:
        return "not-applicable"
    return row["parity"]["verdict"]


def summary(rows: list[dict[str, Any]], command: str) -> str:
    builds = [r for r in rows if r["lever"] is None]
    built = [r for r in builds if r.get("built")]
    failed = [r for r in builds if not r.get("built")]
    by_library = collections.Counter("timm" if r["arch"].startswith(TIMM) else "transformers"
                                     for r in builds)
    built_library = collections.Counter("timm" if r["arch"].startswith(TIMM) else "transformers"
                                        for r in built)
    env = collections.Counter(f"torch {r.get('torch')}, transformers {r.get('transformers')}, "
                              f"timm {r.get('timm')}, commit {r.get('commit')}" for r in builds)
    lines = ["# Lever contracts beyond the zoo: the arch sweep on a CPU", "",
             f"Made by `{command}` (see README.md). Rows: `results.jsonl`.", "",
             "Environments: " + "; ".join(f"{k} ({n} architectures)" for k, n in env.items()), "",
             "## Architectures", "",
             "| library | tried | built | not built |", "| --- | ---: | ---: | ---: |"]
    for library in sorted(by_library):
        lines.append(f"| {library} | {by_library[library]} | {built_library[library]} | "
                     f"{by_library[library] - built_library[library]} |")
    seconds = sum(r.get("seconds") or 0 for r in rows)
    lines += ["", f"{len(builds)} architectures tried, {len(built)} built and trained one step at "
              f"size tiny; {seconds / 3600:.1f} h of worker time in all.", "",
              "### Not built, by reason", ""]
    groups: dict[str, list[str]] = collections.defaultdict(list)
    for r in failed:
        groups[_reason_group(r.get("error") or "unknown")].append(r["arch"])
    for reason, names in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        example = next(r.get("error") for r in failed if r["arch"] == names[0])
        lines.append(f"- **{len(names)}**: {', '.join(names)}. E.g. `{example[:300]}`")
    lever_rows = [r for r in rows if r["lever"] is not None]
    lines += ["", "## Levers", "",
              "Per lever over the built architectures: applies (its `applies` said yes), parity "
              "verdicts (N/A: a parity step raised, so nothing could be compared), refused (it "
              "applied, then refused in its own words while patching), "
              "errors (raised while applying, stepping or undoing), undo failures; not "
              "applicable (with a reason) and skipped (needs a CUDA device). Median seconds of "
              "the contract where it ran.", "",
              "| lever | applies | PARITY | DAMAGED | NOT_MEASURED | N/A | refused | errors | "
              "undo failures | not applicable | skipped | median s |",
              "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for lever_id in sorted({r["lever"] for r in lever_rows}):
        mine = [r for r in lever_rows if r["lever"] == lever_id]
        words = collections.Counter(outcome(r) for r in mine)
        applies = len([r for r in mine if r.get("parity") is not None or r.get("refused")
                       or (r.get("error") and r.get("error_stage") not in ("applies", "worker"))])
        undo_failed = len([r for r in mine if r.get("undo_ok") is False])
        times = sorted(r.get("seconds") or 0 for r in mine if r.get("parity") is not None)
        median = f"{times[len(times) // 2]:.1f}" if times else ""
        lines.append(f"| {lever_id} | {applies} | {words['PARITY']} | {words['DAMAGED']} | "
                     f"{words['NOT_MEASURED']} | {words['N/A']} | {words['refused']} | "
                     f"{words['error']} | "
                     f"{undo_failed} | "
                     f"{words['not-applicable']} | {words['skipped']} | {median} |")
    lines += ["", "## Failures", "",
              "Every lever row that was DAMAGED, NOT_MEASURED or N/A, raised or did not undo, by "
              "lever.",
              ""]
    for lever_id in sorted({r["lever"] for r in lever_rows}):
        bad = [r for r in lever_rows if r["lever"] == lever_id and (
            outcome(r) in ("DAMAGED", "NOT_MEASURED", "N/A", "error")
            or r.get("undo_ok") is False)]
        if bad:
            lines += [f"### {lever_id}", ""] + [f"- `{r['arch']}`: {describe(r)}" for r in bad]
            lines.append("")
    refused = [r for r in lever_rows if outcome(r) == "refused"]
    if refused:
        lines += ["## Refused", "", "Levers that applied and then refused while patching, in "
                  "their own words.", ""]
        groups = collections.defaultdict(list)
        for r in refused:
            groups[(r["lever"], _reason_group(r["refused"]))].append(r)
        for (lever_id, _), mine in sorted(groups.items()):
            names = ", ".join(f"`{r['arch']}`" for r in mine)
            lines.append(f"- {lever_id} on {len(mine)}: {names}. E.g. {mine[0]['refused'][:300]}")
        lines.append("")
    return "\n".join(lines) + "\n"


def describe(row: dict[str, Any]) -> str:
    parts = []
    if row.get("parity") is not None and row["parity"]["verdict"] != "PARITY":
        parts.append(f"{row['parity']['verdict']}: {row['parity']['note'][:400]}")
    if row.get("error"):
        parts.append(f"error in {row.get('error_stage')}: {row['error'][:400]}")
    if row.get("undo_ok") is False:
        parts.append("undo: " + "; ".join(row.get("undo_problems") or [])[:400])
    return " | ".join(parts).replace("\n", " ")


# --- the command line ----------------------------------------------------------------------------


def choose(args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    """The architectures to run and, for timm's, why each was chosen."""
    why: dict[str, str] = {}
    if args.only:
        names = [n.strip() for n in args.only.split(",") if n.strip()]
    else:
        names = transformers_architectures() if args.library in ("transformers", "all") else []
        if args.library in ("timm", "all"):
            for name, reason in timm_architectures(args.timm_all):
                names.append(name)
                why[name] = reason
    if args.sample is not None:
        # the first N of a seeded shuffle: a run stopped early is itself a seeded sample
        names = sorted(names)
        random.Random(args.seed).shuffle(names)
        names = names[: args.sample]
    return names, why


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/arch_sweep_cpu")
    parser.add_argument("--library", choices=("transformers", "timm", "all"), default="all",
                        help="whose architectures (default all: timm where it imports)")
    parser.add_argument("--only", help="architectures, comma-separated (opt,bart/seq2seq,"
                        "timm:resnet18)")
    parser.add_argument("--sample", type=int, help="a seeded random sample of this many, run in "
                        "the sample's order (the first N of a seeded shuffle)")
    parser.add_argument("--seed", type=int, default=0, help="the sample's seed")
    parser.add_argument("--levers", help="lever ids, comma-separated (default: all but those "
                        "on the factory's parameters)")
    parser.add_argument("--timeout-s", type=float, default=TIMEOUT_S,
                        help=f"per architecture (default {TIMEOUT_S:.0f})")
    parser.add_argument("--parity-steps", type=int, default=PARITY_STEPS)
    parser.add_argument("--resume", action="store_true",
                        help="skip architectures that already have rows in OUT/results.jsonl")
    parser.add_argument("--timm-all", action="store_true",
                        help="every timm model, not one per module")
    parser.add_argument("--list", action="store_true", help="print the architectures and exit")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--rows-file", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    ids = lever_ids(args.levers)
    if args.worker:
        return worker(args.worker, ids, args.parity_steps, args.rows_file)
    if args.library in ("timm", "all") and not args.only:
        try:
            import_timm()
        except Exception as exc:  # noqa: BLE001 - timm needs torchvision, which may not import
            if args.library == "timm":
                raise SystemExit(f"--library timm: timm does not import here ({_short(exc)})")
            print(f"timm does not import here ({_short(exc)}): transformers only", flush=True)
            args.library = "transformers"
    names, why = choose(args)
    if args.list:
        for name in names:
            print(name + (f"  # {why[name]}" if name in why else ""))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "results.jsonl"
    old = read_rows(path)
    names = pending(names, old, args.resume)
    meta = versions()
    command = "python bench/arch_sweep.py " + " ".join(argv if argv is not None else sys.argv[1:])
    started = time.perf_counter()
    print(f"{len(names)} architectures x {len(ids)} levers -> {path}", flush=True)
    rows: list[dict[str, Any]] = []
    for i, name in enumerate(names, 1):
        t0 = time.perf_counter()
        mine = [{**r, **meta, **({"chosen": why[name]} if name in why else {})}
                for r in run_worker(name, ids, args)]
        rows += mine
        write_rows(path, merged(old, rows))
        build = next((r for r in mine if r["lever"] is None), {})
        words = collections.Counter(outcome(r) for r in mine if r["lever"] is not None)
        status = (", ".join(f"{k} {v}" for k, v in sorted(words.items())) if build.get("built")
                  else f"not built: {build.get('error', '')[:150]}")
        print(f"[{i}/{len(names)}] {name}: {status} ({time.perf_counter() - t0:.0f}s)", flush=True)
    all_rows = merged(old, rows)
    atomic_write_text(args.out / "summary.md", summary(all_rows, command))
    print(f"wrote {path} and summary.md in {time.perf_counter() - started:.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
