"""Benchmark: ``levers tune`` against the peers on models it was not tuned on, one row per model
and budget (issue 33's goal table).

    # on the H200 (each model: tune's budget, then ~6 rows of 3 + 10 steps, each compiled anew)
    PYTHONPATH=src python bench/tune_sweep.py --models zoo@gpt2,bench/outside_zoo.py:make@opt --budget 3m \
        --out $OUT/tune_sweep_h200
    # a tiny CPU run of the whole path (dynamo's eager backend in the compile rows)
    PYTHONPATH=src python bench/tune_sweep.py --models zoo@nanogpt --size tiny --device cpu \
        --budget 60 --out /tmp/ts

For each model (``SPEC@MODEL``, a workload spec and its ``model`` parameter: ``zoo@gpt2``,
``bench/outside_zoo.py:make@opt``), in one process on one GPU:

1. ``levers.Step(SPEC, {model, size, device}).tune(budget=...)``: the stack it proves, its
   tokens/s ratio with CI95 from its own A/B, the time it spent (``spent_s``: the build, the
   audit's capture and the search, wall clock), every A/B with the seconds of its phases.
2. The default step, the peers as their users write them (``compile-model``: ``model.compile()``;
   ``compile-model-ro``: its ``reduce-overhead`` form; ``compile-layers``: ``block.compile()`` on
   each repeated block; ``torchtitan-float8``: torchao's tensorwise float8 as torchtitan ships it,
   then per-layer compile and the loss compiled (a Hugging Face model's ``loss_function``; since
   s60), where torchao is installed; ``liger``: Liger Kernel's patch for the
   model type, where it has one) and tune's stack (``levers.apply``), each built fresh from the
   same seed after ``torch._dynamo.reset()`` and timed by ``bench/levers_vs_peers.py``'s
   ``measure`` (3 warm-up and 10 timed steps, more where 10 take under ``--min-timed-s``, 3 s;
   median tokens/s, bootstrap CI95 over steps). Every
   peer runs with the model's KV cache off (``use_cache=False``, as levers' own compile levers
   run and as a training script sets it): a Hugging Face config ships it on, and per-layer
   compile then guards on each layer's cache slot and recompiles per layer past dynamo's limit,
   so that half of llama's 16 layers ran eager in the peer rows up to s42 (``cache_off`` on
   a peer's timed row says which rows had it).
3. Tune's stack and the best peer once more, built side by side and timed in alternation (on
   CUDA in windows of about 0.5 s of steps, as levers' A/Bs; elsewhere one step of each; the
   order swapped every pair; ``head_to_head``, ``--no-head-to-head`` leaves it out): step 2
   times each variant in its own block, and a host that drifts between blocks lands on
   ``vs_best_peer`` (ibert at c7a70a5 on an H100: tune's stack and ``model.compile()``, the
   same program, 4% apart). ``vs_best_peer_paired`` is the median of the stack's tokens/s over
   the peer's across the pairs, with a CI95 by a bootstrap of the pairs.

Writes ``OUT/summary.json`` after every model (rows merged by model, size and budget): per row
``model``, ``family``, ``shape``, ``budget_s``, ``spent_s``, ``stack``,
``tokens_per_s_ratio_ci95`` (tune's A/B of its stack against the default), ``same_run_ratio``
(tune's stack timed beside the peers), ``peers`` (each peer's ratio to the default, same
process), ``best_peer``, ``vs_best_peer`` (``same_run_ratio`` over the best peer's), ``commit``,
``torch``, ``gpu``, ``date``; the timed rows under ``rows``; ``peers_missing``, each peer that
did not run and why (the best peer is the best of those that ran).

``--rounds R`` times step 2's variants R times, each round a fresh build of each, the order
reversed every other round; each variant's ratio is then read from its samples of every round
(``rounds_tokens_per_s``: its median per round; ``spread``: (largest - smallest) / smallest). On
timm's test_efficientnet (H100, s52: 2-3 ms steps) one program's median moved 10-15% from one
block to the next in one process, more than tune's stack and the best peer differed.

``--retime SUMMARY`` searches nothing: each model's stack and tune's own A/B come from its row in
an earlier summary (``searched``: that row's commit, date and call) and only step 2 runs, for a
row whose first run left a peer out. A stack searched on another GPU is not this GPU's answer
(s54: vit's, of an H200, ran 1.010x on an H100 where per-layer compile ran 1.256x): such a row
says so (``searched_elsewhere``).
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import random
import statistics
import sys
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

import levers  # noqa: E402
from levers.ab.stats import paired_ratio_ci  # noqa: E402
from levers.ab.timing import WINDOW_S, longest_window, window_for  # noqa: E402
from levers.environment import levers_commit_id  # noqa: E402
from levers.levers._find import training_cache_off  # noqa: E402
from levers.output.atomic import atomic_write_text  # noqa: E402
from levers.tune.budget import parse_duration_s  # noqa: E402
from levers.workloads.arch import entry as arch_entry  # noqa: E402
from levers.workloads.zoo import MODELS as ZOO_MODELS  # noqa: E402

from levers_vs_peers import _bootstrap, _sync, apply_peer, measure, steps_to_fill  # noqa: E402

PEERS = ("compile-model", "compile-model-ro", "compile-layers", "torchtitan-float8", "liger")
PEER_TRANSFORMS = {
    "compile-model": "compile-model",
    "compile-model-ro": "compile-model-ro",
    "compile-layers": "compile-layers",
    # torchtitan compiles the loss beside the blocks (its compile.components: model, loss)
    "torchtitan-float8": "float8-torchtitan+compile-layers+compile-loss",
    "liger": "liger",
}
TUNED = "tuned"


def _peer_missing(peer: str, workload: Any) -> str | None:
    """Why the peer cannot run here (its package, its device, a model it has no patch for)."""
    import importlib.util

    if peer == "compile-model-ro" and workload.device.type != "cuda":
        return "reduce-overhead (CUDA graphs) needs a GPU"
    if peer == "torchtitan-float8":
        if importlib.util.find_spec("torchao") is None:
            return "torchao is not installed"
        if workload.device.type != "cuda":
            return "float8 needs a GPU"
    if peer == "liger":
        try:
            import liger_kernel.transformers as liger
        except Exception:  # noqa: BLE001 - absent or broken: the row says so
            return "liger-kernel is not installed"
        model_type = getattr(getattr(workload.model, "config", None), "model_type", None)
        if model_type is None or not hasattr(liger, f"apply_liger_kernel_to_{model_type}"):
            return f"Liger Kernel has no patch for {model_type or type(workload.model).__name__}"
    return None


def _free() -> None:
    torch._dynamo.reset()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def timed_row(spec: str, params: dict[str, Any], variant: str, stack: list[str], args) -> dict:
    """One variant built fresh and timed; a variant that cannot run is a row that says why."""
    row: dict[str, Any] = {"variant": variant}
    cleanups: list[Callable[[], None]] = []
    held: dict[str, Any] = {}  # the workload, dropped before the device's memory is freed
    with _variant_run(row, args, cleanups, held):
        held[variant], built = _built(spec, params, variant, stack, cleanups)
        row["tokens_per_step"] = held[variant].tokens_per_step
        if variant == "default":
            row["describe"] = describe(spec, params.get("model", ""), held[variant])
        if "missing" in built:
            row.update(status="not-applicable", error=built["missing"])
            return row
        row.update(built)
        row.update(measure(held[variant], args.warmup, args.steps, args.min_timed_s))
        row["status"] = "ok"
    return row


@contextmanager
def _variant_run(out: dict[str, Any], args, cleanups: list[Callable[[], None]],
                 held: dict[str, Any]) -> Iterator[None]:
    """Around a build and its timing: an exception is recorded in ``out`` (a failing variant is
    a result, not a crash); then the undos run and the ``held`` workloads are dropped before
    the device's memory is freed."""
    _free()
    try:
        yield
    except Exception as exc:  # noqa: BLE001 - a failing variant is a result, not a crash
        out.update(status="failed", error=f"{type(exc).__name__}: {exc}"[:600])
        if args.debug:
            traceback.print_exc()
    finally:
        for cleanup in reversed(cleanups):
            cleanup()
        held.clear()
        _free()


def _built(spec: str, params: dict[str, Any], variant: str, stack: list[str],
           cleanups: list[Callable[[], None]]) -> tuple[Any, dict[str, Any]]:
    """The workload of ``variant`` (the default, tune's stack or a peer) built from seed 0, its
    undos appended to ``cleanups``, and what the row records of it: the levers applied, the
    peer's KV cache turned off, or why the peer cannot run here (``missing``)."""
    torch.manual_seed(0)
    workload = levers.Step(spec, params=params).workload()
    compile_options = {"backend": "eager"} if workload.device.type != "cuda" else {}
    if variant in PEER_TRANSFORMS:
        missing = _peer_missing(variant, workload)
        if missing is not None:
            return workload, {"missing": missing}
        cleanups.append(training_cache_off(workload.model))
        cleanups += apply_peer(PEER_TRANSFORMS[variant], workload, compile_options)
        return workload, {"cache_off": True}
    if variant == TUNED and stack:
        handle = levers.apply(workload, stack, **compile_options)
        cleanups.append(handle.undo)
        return workload, {"applied": list(handle.applied)}
    return workload, {}


def _one_step_s(workload: Any) -> float:
    """One step's wall time, the device idle at its start and at its end."""
    _sync(workload.device)
    begin = time.perf_counter()
    workload.step()
    _sync(workload.device)
    return time.perf_counter() - begin


def head_to_head(spec: str, params: dict[str, Any], stack: list[str], peer: str,
                 args) -> dict[str, Any]:
    """tune's stack and ``peer`` built side by side and timed in alternation, so that the
    process's drift lands on both: the variant rows time each in its own block, and at c7a70a5
    on an H100 ibert's stack and ``model.compile()``, the same program, read 4% apart that way
    (eager's own block drifted 165-195 ms a step); at a0a3a0a (s58) mistral's float8 forms, one
    program, ran blocks 7% apart (the GPU at its power cap). On CUDA the two alternate in windows
    of about :data:`~levers.ab.timing.WINDOW_S` of steps, the order swapped every pair of
    windows, as levers' own A/Bs do (a side that draws less power lends the other its clock
    when they alternate step by step: s57); elsewhere step by step, the order swapped every pair.
    ``ratio``: the median of tune's tokens/s over the peer's, pair i each side's i-th step, CI95
    by ab's paired bootstrap (:func:`levers.ab.stats.paired_ratio_ci`); as many pairs as fill
    ``args.min_timed_s`` a side (at least ``args.steps``, at most :data:`MAX_PAIRS`);
    ``window``: the steps of a window (1: step by step)."""
    out: dict[str, Any] = {"peer": peer}
    cleanups: list[Callable[[], None]] = []
    sides: dict[str, Any] = {}
    with _variant_run(out, args, cleanups, sides):
        workloads = side_by_side(spec, params, [(TUNED, TUNED, stack), (peer, peer, [])],
                                 cleanups, sides)
        pace_s = warm_pace_s(workloads, args.warmup)
        pairs = steps_to_fill(args.steps, args.min_timed_s, pace_s, MAX_PAIRS)
        window = window_steps(window_for(workloads[0].device, WINDOW_S), pace_s, pairs)
        durations = timed_in_turn(workloads, schedule(
            "alternated" if window == 1 else "windows", pairs, window))
        rates = {name: [(w.tokens_per_step or 0) / d for d in ds]
                 for name, w, ds in zip((TUNED, peer), workloads, durations)}
        ci = paired_ratio_ci(rates[peer], rates[TUNED], num_resamples=2000, seed=0)
        out.update(
            status="ok", pairs=pairs, window=window, ratio=ci.ratio, ci95=[ci.lo, ci.hi],
            tokens_per_s={v: statistics.median(r) for v, r in rates.items()},
        )
    return out


def window_steps(window_s: float, step_s: float, pairs: int) -> int:
    """The steps of a window that lasts about ``window_s`` at ``step_s`` a step, at most ab's
    :func:`~levers.ab.timing.longest_window` of ``pairs``; 1 (step by step) where ``window_s`` or
    ``step_s`` is not positive."""
    if window_s <= 0 or step_s <= 0:
        return 1
    return max(1, min(round(window_s / step_s), longest_window(pairs)))


def side_by_side(spec: str, params: dict[str, Any], variants: list[tuple[str, str, list[str]]],
                 cleanups: list[Callable[[], None]], held: dict[str, Any]) -> list[Any]:
    """The workloads of ``variants`` (name, variant, stack: :func:`_built`'s) built side by side,
    each held under its name in ``held`` (for :func:`_variant_run` to drop); a peer that cannot
    run here raises, saying why."""
    for name, variant, stack in variants:
        held[name], built = _built(spec, params, variant, stack, cleanups)
        if "missing" in built:
            raise RuntimeError(built["missing"])
    return [held[name] for name, _, _ in variants]


def warm_pace_s(workloads: list[Any], warmup: int) -> float:
    """``warmup`` steps of each workload in turn; the slowest one's last step (s)."""
    last_s = 0.0
    for _ in range(warmup):
        last_s = max(_one_step_s(w) for w in workloads)
    return last_s


def schedule(way: str, steps: int, window: int = 1) -> list[int]:
    """The order of the timed steps of two workloads, as their indexes (0, 1): ``steps`` of
    each. blocks: 0's, then 1's; alternated: one of each, the order swapped every pair; windows:
    ``window`` of 0's, then of 1's, the order swapped every pair of windows."""
    if way == "blocks":
        return [0] * steps + [1] * steps
    size = 1 if way == "alternated" else window
    out: list[int] = []
    for number, start in enumerate(range(0, steps, size)):
        count = min(size, steps - start)
        first, second = (0, 1) if number % 2 == 0 else (1, 0)
        out += [first] * count + [second] * count
    return out


def timed_in_turn(workloads: list[Any], order: list[int]) -> tuple[list[float], ...]:
    """Each workload's step times (s, idle device to idle device), its steps run in ``order``."""
    durations: tuple[list[float], ...] = tuple([] for _ in workloads)
    for index in order:
        durations[index].append(_one_step_s(workloads[index]))
    return durations


def _two_do_not_fit(timed: list[dict[str, Any]], variants: tuple[str, str]) -> str | None:
    """Why ``variants`` cannot be held side by side on this GPU (their timed rows' reserved
    peaks add up to more than nine tenths of it), or None."""
    if not torch.cuda.is_available():
        return None
    peaks = [r.get("peak_reserved_bytes") or 0 for r in timed if r["variant"] in variants]
    total = torch.cuda.get_device_properties(0).total_memory
    if sum(peaks) > 0.9 * total:
        return (f"their steps reserve {sum(peaks) / 2**30:.1f} GiB together of the GPU's "
                f"{total / 2**30:.0f} GiB")
    return None


# the most alternated pairs min_timed_s may ask for
MAX_PAIRS = 500


def tune_row(spec: str, params: dict[str, Any], args) -> dict[str, Any]:
    row: dict[str, Any] = {}
    started = time.perf_counter()
    _free()
    try:
        result = levers.Step(spec, params=params).tune(
            budget=args.budget, record=args.out / "tune.record.jsonl",
            progress=lambda line: print(f"  {line}", flush=True),
        )
        proof = result.proof
        row.update(
            stack=list(result.stack),
            # paid where selected, but the budget cut its confirmation: not kept, not refuted
            unconfirmed=list(result.unconfirmed),
            tokens_per_s_ratio=getattr(proof, "tokens_per_s_ratio", None),
            tokens_per_s_ratio_ci95=getattr(proof, "tokens_per_s_ci95", None),
            parity=getattr(proof, "parity", None),
            outcomes=[{"lever": o.lever, "kept": o.kept, "reason": o.reason, "source": o.source}
                      for o in result.outcomes],
            trials=[{"base": list(t.base), "stack": list(t.stack), "decision": t.decision,
                     "tokens_per_s_ratio": t.tokens_per_s_ratio,
                     "tokens_per_s_ci95": t.tokens_per_s_ci95, "parity": t.parity,
                     "parity_note": t.parity_note, "wall_s": t.wall_s, "phase_s": t.phase_s,
                     "error": t.error, "killed": t.killed,
                     "timed_eager_random": t.timed_eager_random, "role": t.role,
                     "num_steps": t.num_steps, "timed_steps": t.timed_steps}
                    for t in result.search.trials],
            search_s=result.search.spent_s,
            notes=list(result.notes) + list(result.search.notes),
        )
    except Exception as exc:  # noqa: BLE001 - a failing search is a result
        row.update(stack=[], tune_error=f"{type(exc).__name__}: {exc}"[:600])
        if args.debug:
            traceback.print_exc()
    row["spent_s"] = time.perf_counter() - started
    return row


def in_rounds(items: list[Any], rounds: int) -> list[tuple[Any, int]]:
    """(item, round) of each of ``items`` in each of ``rounds`` rounds, in the order timed: the
    order reversed every other round (a drift over the session lands on both ends alike)."""
    return [(item, number) for number in range(1, rounds + 1)
            for item in (items if number % 2 else items[::-1])]


def round_name(name: str, number: int) -> str:
    """A variant's name in its round: as it is in the first, ``NAME#R`` in a later one."""
    return name if number == 1 else f"{name}#{number}"


def spread(per_round: dict[str, list[float]]) -> dict[str, float]:
    """(largest - smallest) / smallest of each variant's medians over its rounds, where it has
    more than one."""
    return {v: max(t) / min(t) - 1.0 for v, t in per_round.items() if len(t) > 1}


def compare(row: dict[str, Any], rows: list[dict[str, Any]], rng: random.Random) -> None:
    # each variant's tokens/s samples, of every round it was timed in
    ok: dict[str, list[float]] = {}
    for r in rows:
        if r.get("status") == "ok":
            ok.setdefault(r["variant"], []).extend(r["tokens_per_s_samples"])
    if "default" not in ok:
        return
    med = statistics.median
    ratio = lambda x, y: med(x) / med(y)  # noqa: E731
    samples = ok.__getitem__
    per_round: dict[str, list[float]] = {}
    for r in sorted(rows, key=lambda r: r.get("round", 1)):
        if r.get("status") == "ok":
            per_round.setdefault(r["variant"], []).append(med(r["tokens_per_s_samples"]))
    if any(len(v) > 1 for v in per_round.values()):
        row["rounds_tokens_per_s"] = per_round
        row["spread"] = spread(per_round)
    row["peers"] = {v: ratio(samples(v), samples("default")) for v in ok if v in PEERS}
    # a peer left out or failed is named: the best peer is the best of those that ran
    reasons = {r["variant"]: r.get("error") or r.get("status") for r in rows}
    row["peers_missing"] = {p: reasons.get(p, "not run (left out of --peers)")
                            for p in PEERS if p not in row["peers"]}
    row["best_peer"] = max(row["peers"], key=row["peers"].get) if row["peers"] else None
    # an empty stack runs the default step
    row["same_run_ratio"] = ratio(samples(TUNED), samples("default")) if TUNED in ok else (
        1.0 if not row.get("stack") else None)
    if TUNED in ok:
        row["same_run_ratio_ci95"] = _bootstrap(samples(TUNED), samples("default"), ratio, rng)
    if row["best_peer"] and row["same_run_ratio"] is not None:
        row["vs_best_peer"] = row["same_run_ratio"] / row["peers"][row["best_peer"]]


RETIMED_KEEP = ("model", "size", "budget_s", "params", "stack", "tokens_per_s_ratio",
                "tokens_per_s_ratio_ci95", "parity", "outcomes", "trials", "search_s", "notes",
                "spent_s", "tune_error")


def retimed_row(prior: dict[str, Any]) -> dict[str, Any]:
    """A row whose search ran before (``prior``, from an earlier summary): tune's stack and its
    own A/B kept with the commit, date and call that searched; the default, the peers and the
    stack are timed again now, in this process (``--retime``: a peer the first run left out)."""
    row = {k: prior[k] for k in RETIMED_KEEP if k in prior}
    row["searched"] = {k: prior.get(k) for k in ("commit", "torch", "date", "call", "gpu")}
    row["peers_first_run"] = prior.get("peers")
    here = _environment()
    if prior.get("gpu") and prior["gpu"] != here["gpu"]:
        # s54: vit's stack, searched on an H200 (compile-model, 1.35x there), ran 1.010x on an
        # H100 where per-layer compile ran 1.256x
        row["searched_elsewhere"] = (
            f"the stack was searched on {prior['gpu']} and is timed on {here['gpu']}: a search "
            "on one GPU need not give this GPU's answer; search here to compare tune with the "
            "peers")
    return {**row, **here}


def _environment() -> dict[str, Any]:
    return {
        "commit": levers_commit_id(),
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "date": datetime.date.today().isoformat(),
    }


SWEEP_ROWS = ROOT / "bench/results/arch_sweep_cpu/results.jsonl"


def arch_sample(count: int, seed: int, rows_file: Path = SWEEP_ROWS) -> list[str]:
    """``count`` architectures outside the zoo, a seeded random sample of those the CPU arch
    sweep built (``arch@opt``, ``arch@bart/seq2seq``), in a fixed order."""
    zoo_types = set(ZOO_MODELS)  # the zoo's names are its transformers model types
    built = sorted({r["arch"] for r in map(json.loads, rows_file.read_text().splitlines())
                    if r["lever"] is None and r.get("built")})
    outside = [a for a in built if a.split("/")[0] not in zoo_types]
    return [f"arch@{a}" for a in random.Random(seed).sample(outside, min(count, len(outside)))]


# for a model of neither the zoo nor the arch workload: its family by its head's class, and the
# config fields its shape names
FAMILY_OF_HEAD = {"ForCausalLM": "decoder", "LMHeadModel": "decoder", "ForMaskedLM": "encoder",
                  "ForConditionalGeneration": "encoder-decoder",
                  "ForImageClassification": "vision"}
CONFIG_SHAPE = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "intermediate_size", "vocab_size", "image_size",
                "num_local_experts", "num_experts")


def describe(spec: str, model: str, workload: Any) -> dict[str, Any]:
    """The row's ``family`` and ``shape``: those of the model's entry (the zoo's own, or the
    arch workload's for its model type and task), with the batch and depth it was built at;
    for another spec, the built model's class and config (widths, depth, vocabulary) and its
    batch. ``tokens_per_step`` in both."""
    params = dict(getattr(workload, "params", {}) or {})
    tokens = {"tokens_per_step": workload.tokens_per_step}
    built = {k: params[k] for k in ("batch_size", "layers", "seq_len") if k in params}
    if spec in ("zoo", "arch"):
        entry = (ZOO_MODELS[model] if spec == "zoo"
                 else arch_entry(model, params["task"], params.get("layers")))
        return {"family": entry.family,
                "shape": {**entry.sizes[params.get("size", "full")], **built, **tokens}}
    config = getattr(workload.model, "config", None)
    shape = {k: getattr(config, k) for k in CONFIG_SHAPE if getattr(config, k, None) is not None}
    head = type(workload.model).__name__
    family = next((f for suffix, f in FAMILY_OF_HEAD.items() if head.endswith(suffix)), head)
    return {"family": family, "shape": {**shape, **built, **tokens}}


def model_params(spec: str, model: str, size: str, device: str) -> dict[str, Any]:
    """The workload parameters of one ``SPEC@MODEL`` entry; ``arch@bart/seq2seq`` names the
    task after the slash, as the arch sweep does."""
    params: dict[str, Any] = {"model": model, "size": size, "device": device}
    if spec == "arch" and "/" in model:
        params["model"], params["task"] = model.split("/", 1)
    return params


def fit_batch(spec: str, params: dict[str, Any], tune_error: str) -> dict[str, Any] | None:
    """Where tune found the step out of this GPU's memory (an H100 lent for the H200's rows:
    gemma3 and longcat_flash at full), the batch levers memory predicts to fit it, with what it
    was; None where the step did not run out of memory, has a batch given, where none fits or
    the prediction says its batch fits (tune would fail alike)."""
    if ("ran out of the GPU's memory" not in tune_error or "batch_size" in params
            or not torch.cuda.is_available()):
        return None
    total_gib = torch.cuda.get_device_properties(0).total_memory / 2**30
    step = levers.Step(spec, params={k: v for k, v in params.items() if k != "device"})
    fit = step.fit("batch_size", gpu=f"{total_gib:.1f}GiB")
    start = max((p.value for p in fit.curve if not p.fits), default=None)
    if fit.best is None or start is None or fit.best >= start:
        return None
    return {"batch_size": fit.best, "from": start, "gpu_gib": round(total_gib, 1),
            "predicted_reserved_gib": {p.value: round(p.peak_reserved_bytes / 2**30, 1)
                                       for p in fit.curve},
            "why": "the step ran out of this GPU's memory at its batch; levers memory's fit"}


def row_key(row: dict[str, Any]) -> tuple:
    """What one row of a summary is of: its model, size and budget."""
    return row["model"], row["size"], row["budget_s"]


def _merge(path: Path, row: dict[str, Any]) -> list[dict[str, Any]]:
    rows = json.loads(path.read_text())["rows"] if path.is_file() else []
    return [r for r in rows if row_key(r) != row_key(row)] + [row]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="", help="SPEC@MODEL, comma-separated")
    parser.add_argument("--arch-sample", metavar="N:SEED",
                        help="add N architectures outside the zoo, a seeded sample of those the "
                             "CPU arch sweep built (arch_sample)")
    parser.add_argument("--part", metavar="I/N", default="0/1",
                        help="run only the models at positions I, I+N, ... (one GPU of N)")
    parser.add_argument("--budget", default="3m", help="levers tune's budget per model")
    parser.add_argument("--size", default="full")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--set", action="append", default=[], metavar="K=V",
                        help="more parameters for every model (layers=8)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--min-timed-s", type=float, default=3.0,
                        help="time each variant at least this long (more steps on short ones)")
    parser.add_argument("--peers", default=",".join(PEERS))
    parser.add_argument("--deadline-s", type=float, default=None,
                        help="start no model after this many seconds")
    parser.add_argument("--retime", type=Path, metavar="SUMMARY",
                        help="search nothing: take each model's stack from this summary.json "
                             "(same size and budget) and time it again beside the peers")
    parser.add_argument("--rounds", type=int, default=1,
                        help="time the default, the stack and the peers this many times (fresh "
                             "builds, the order reversed every other round), ratios over all")
    parser.add_argument("--head-to-head", action=argparse.BooleanOptionalAction, default=True,
                        help="after the variants, time tune's stack and the best peer again, "
                             "alternated (in windows of steps on CUDA; vs_best_peer_paired, with "
                             "a CI95)")
    parser.add_argument("--list", action="store_true", help="print the models (of --part) and exit")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--debug", action="store_true")
    args = parser.parse_args(argv)
    if not args.list and args.out is None:
        parser.error("--out is required")
    budget_s = parse_duration_s(args.budget)
    extra = dict(item.split("=", 1) for item in args.set)
    peers = [p for p in args.peers.split(",") if p]
    rng = random.Random(0)
    started = time.perf_counter()
    entries = [m.strip() for m in args.models.split(",") if m.strip()]
    if args.arch_sample:
        count, seed = (int(x) for x in args.arch_sample.split(":"))
        entries += arch_sample(count, seed)
    if not entries:
        parser.error("name the models: --models zoo@llama,arch@opt or --arch-sample 8:33")
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    part, parts = (int(x) for x in args.part.split("/"))
    if args.list:
        print("\n".join(entries[part::parts]))
        return 0
    prior: dict[tuple, dict[str, Any]] = {}
    if args.retime is not None:
        prior = {row_key(r): r for r in json.loads(args.retime.read_text())["rows"]}
        absent = [e for e in entries[part::parts] if (e, args.size, budget_s) not in prior]
        if absent:
            parser.error(f"--retime {args.retime} has no row of {', '.join(absent)} at size "
                         f"{args.size} and budget {budget_s:.0f}s: run those without --retime")
    args.out.mkdir(parents=True, exist_ok=True)
    summary = args.out / "summary.json"
    for entry in entries[part::parts]:
        if args.deadline_s is not None and time.perf_counter() - started > args.deadline_s:
            print(f"{entry}: not started, past the deadline", flush=True)
            continue
        spec, model = entry.rsplit("@", 1)
        params = {**model_params(spec, model, args.size, args.device), **extra}
        if prior:
            print(f"{entry}: retiming the stack of its earlier search beside the peers", flush=True)
            row = retimed_row(prior[(entry, args.size, budget_s)])
            if "searched_elsewhere" in row:
                print(f"{entry}: {row['searched_elsewhere']}", flush=True)
        else:
            print(f"{entry}: tune --budget {args.budget}", flush=True)
            tuned = tune_row(spec, params, args)
            fitted = fit_batch(spec, params, tuned.get("tune_error") or "")
            if fitted is not None:  # the step ran out of this GPU's memory: at the batch that fits
                print(f"{entry}: out of memory at its batch; again at batch_size="
                      f"{fitted['batch_size']} (levers memory's fit for this GPU)", flush=True)
                params = {**params, "batch_size": fitted["batch_size"]}
                tuned = {"fitted": fitted, **tune_row(spec, params, args)}
            row = {"model": entry, "size": args.size, "budget_s": budget_s, "params": params,
                   **_environment(), **tuned}
        row["incomplete"] = "not timed yet: the default, the stack, the peers"
        atomic_write_text(summary, json.dumps({"rows": _merge(summary, row)}, indent=1,
                                              default=str) + "\n", make_parents=True)
        timed = []
        # tune's stack right after the default, then the peers: a row the per-model timeout
        # cuts keeps the stack's timing and the peers reached, marked incomplete (written after
        # each variant)
        once = ["default", *([TUNED] if row.get("stack") else []), *peers]
        variants = in_rounds(once, args.rounds)  # --rounds
        for i, (variant, number) in enumerate(variants):
            one = timed_row(spec, params, variant, row.get("stack", []), args)
            one["round"] = number
            if one.get("status") == "ok":
                one["tokens_per_s"] = statistics.median(one["tokens_per_s_samples"])
            timed.append(one)
            shown = round_name(variant, number)
            print(f"  {entry}:{shown} {one['status']} {one.get('tokens_per_s') or one.get('error', '')}",
                  flush=True)
            row["rows"] = timed
            described = next((t.pop("describe") for t in timed if "describe" in t), None)
            if described is not None:
                row.update(described)
            compare(row, timed, rng)
            left = [round_name(v, n) for v, n in variants[i + 1:]]
            if left:
                row["incomplete"] = f"not timed yet: {', '.join(left)}"
            else:
                row.pop("incomplete", None)
            rows = _merge(summary, row)
            atomic_write_text(summary, json.dumps({"rows": rows}, indent=1, default=str) + "\n",
                              make_parents=True)
        best = row.get("best_peer")
        ran = {r["variant"] for r in timed if r.get("status") == "ok"}
        if args.head_to_head and best and {TUNED, best} <= ran:
            # the stack and the best peer once more, alternated (head_to_head: in windows of
            # steps on CUDA), where two of their steps fit the device
            too_big = _two_do_not_fit(timed, (TUNED, best))
            row["head_to_head"] = ({"peer": best, "status": "not-run", "error": too_big}
                                   if too_big else
                                   head_to_head(spec, params, row["stack"], best, args))
            if row["head_to_head"]["status"] == "ok":
                row["vs_best_peer_paired"] = row["head_to_head"]["ratio"]
                row["vs_best_peer_paired_ci95"] = row["head_to_head"]["ci95"]
            print(f"  {entry}: head to head with {best}: {row['head_to_head']}", flush=True)
            atomic_write_text(summary, json.dumps({"rows": _merge(summary, row)}, indent=1,
                                                  default=str) + "\n", make_parents=True)
        print(f"{entry}: stack {row.get('stack')} same-run {row.get('same_run_ratio')} "
              f"best peer {row.get('best_peer')} vs_best_peer {row.get('vs_best_peer')} "
              f"spent {row.get('spent_s', 0):.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
