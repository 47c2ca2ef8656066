"""The optimizer-state levers' shared layer: a torchao Adam put behind the user's own optimizer.

``adamw-bf16-state`` and ``adamw-8bit`` keep Adam's two moments smaller. The update is
torchao's; this module only puts it behind the optimizer object the step already holds.

Why in place, on the same object: the step closure of a built-in workload
(``training_step(model, optimizer, ...)``), a user's script, a Hugging Face Trainer
(``trainer.optimizer``) and every LR scheduler (``scheduler.optimizer``) hold a reference to the
optimizer. A new optimizer set on ``Workload.optimizer`` or ``Target.optimizer`` would never be
stepped (the step would go on calling the old one, fp32 state and all). Swapping
``__class__`` is not enough either: an LR scheduler made before the lever wraps
``optimizer.step`` in an instance attribute that calls the class's original ``step`` function
directly. So :func:`swap` changes two attributes of the optimizer object:

- ``optimizer.state`` becomes the torchao optimizer's state (bf16 or 8-bit moments): what
  ``state_dict()``, ``levers memory``'s labelling and a capture's ``state_bytes`` read;
- ``optimizer.step`` becomes an instance function that copies the current hyper-parameters of
  each of the optimizer's own ``param_groups`` (lr, betas, eps, weight_decay, so that LR
  schedulers and user changes keep acting) into the torchao optimizer's groups and runs its
  update, inside ``Optimizer.profile_hook_step`` (the global and per-optimizer step hooks and
  the ``Optimizer.step#AdamW.step`` profiler label run as before; ``optimizer.step.inner`` is
  the torchao optimizer). It carries LRScheduler's
  ``_wrapped_by_lr_sched`` marker and sets ``_opt_called``, which is what the scheduler's own
  wrapper does (torch/optim/lr_scheduler.py, ``patch_track_step_called``), so a scheduler made
  before or after the lever steps without warnings.

``param_groups`` and ``defaults`` are never written. The undo puts ``state``, ``step`` and
``_opt_called`` back as they were: the same state dict, holding the same tensors, bitwise (the
moments learned while the lever was on are dropped with the torchao optimizer; the optimizer
is the one the lever was applied to, as every lever's undo leaves it).

An optimizer that has already stepped: its moments seed the torchao state (cast to bf16, or
quantized), its step counts carry over, and its own fp32 state tensors, kept for the undo, are
parked on the host (their device storage freed with ``untyped_storage().resize_(0)``, as FSDP
frees parameters, and refilled by the undo), so the device memory the lever saves is saved
while it is on. On a CPU there is nothing to free and they stay where they are.

Refused (``applies`` says why and what to do): an optimizer other than exactly
``torch.optim.Adam`` or ``AdamW``; amsgrad, maximize or differentiable groups; an Adam whose
groups mix L2 and decoupled weight decay; non-floating-point or complex parameters; torchao
missing, or without the pieces these levers use; an optimizer already under one of them.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

import torch

from levers.optional import import_quietly
from levers.capture.env import tensor_nbytes
from levers.levers._patch import Undos

INSTALL = "torchao is not installed (pip install torchao, or pip install 'levers[optim]')"
ADAM_TYPES = (torch.optim.Adam, torch.optim.AdamW)
# set on the optimizer while a lever holds its state: the id of that lever
MARK = "_levers_optimizer_state"


def torchao_adam() -> Any | None:
    """``torchao.optim.adam``, or None when torchao is not installed."""
    try:
        return import_quietly("torchao.optim.adam")
    except ImportError:
        return None


def is_adamw(optimizer: torch.optim.Optimizer) -> bool:
    """Decoupled weight decay: AdamW, or an Adam whose groups all set decoupled_weight_decay."""
    if type(optimizer) is torch.optim.AdamW:
        return True
    return all(g.get("decoupled_weight_decay", False) for g in optimizer.param_groups)


def reason(optimizer: torch.optim.Optimizer | None, needs: tuple[str, ...] = ()) -> str | None:
    """Why an optimizer-state lever does not apply to ``optimizer``, or None.

    ``needs`` names the attributes of ``torchao.optim.adam`` the lever uses."""
    if optimizer is None:
        return "no optimizer given (levers.apply(model, ..., optimizer=opt))"
    if type(optimizer) not in ADAM_TYPES:
        return (
            f"{type(optimizer).__name__} is not torch.optim.Adam or AdamW: these levers keep "
            "Adam's two moments smaller; train with torch.optim.AdamW to use them, or keep this "
            "optimizer's state as it is"
        )
    held = getattr(optimizer, MARK, None)
    if held is not None:
        return f"its state is already kept by {held}: one optimizer-state lever at a time"
    groups = optimizer.param_groups
    for flag, why in (
        ("amsgrad", "keeps a third moment these levers do not carry"),
        ("maximize", "has no torchao form"),
        ("differentiable", "has no torchao form"),
    ):
        if any(g.get(flag) for g in groups):
            return f"{flag}=True {why}; use it without {flag}, or keep the fp32 state"
    decoupled = {bool(g.get("decoupled_weight_decay", False)) for g in groups}
    if type(optimizer) is torch.optim.Adam and len(decoupled) > 1:
        return "its groups mix L2 and decoupled weight decay (torchao takes one for all groups)"
    params = [p for g in groups for p in g["params"]]
    if not params:
        return "the optimizer has no parameters"
    odd = next((p for p in params if not p.is_floating_point() or p.is_complex()), None)
    if odd is not None:
        return f"a parameter is {odd.dtype}: torchao's Adam updates real floating-point ones"
    ao = torchao_adam()
    if ao is None:
        return INSTALL
    missing = [name for name in ("_AdamBase", *needs) if not hasattr(ao, name)]
    if missing:
        return (
            f"this torchao has no torchao.optim.adam.{missing[0]} (the lever was written "
            "against torchao 0.18): pip install 'torchao>=0.17,<0.19'"
        )
    return None


# tokens/s against the step's fused AdamW on the H200, each on top of CUDA-graph compile (nanogpt,
# full size: bench/results/tune_sweep_h200/s40b.record.jsonl)
MEASURED_ON_GPU = {"adamw-8bit": "0.17x", "adamw-bf16-state": "0.43x"}


def slower_than_multi_tensor(
    optimizer: torch.optim.Optimizer | None, device_type: str, lever_id: str
) -> str | None:
    """Why ``lever_id`` loses for speed against ``optimizer`` on ``device_type``, or None.

    torchao's update runs one compiled kernel per parameter; a fused or multi-tensor (foreach,
    the default on a GPU) AdamW updates every parameter in a few launches, so the smaller state
    (a share of the optimizer's few percent of the step) does not buy back the launches: these
    are memory levers. None against a per-tensor loop (foreach=False), where the
    launches are the baseline's too. None off CUDA too: measured on CUDA only."""
    if optimizer is None or device_type != "cuda":
        return None
    groups = optimizer.param_groups
    if any(g.get("fused") for g in groups):
        how = "fused"
    elif any(g.get("foreach") is not False for g in groups):
        how = "multi-tensor (foreach)"
    else:
        return None
    return (
        f"its update runs one compiled kernel per parameter where this step's {how} AdamW runs "
        f"a few for all of them: a memory lever, measured {MEASURED_ON_GPU[lever_id]} tokens/s "
        "against fused AdamW on an H200"
    )


def slower_here_of(lever_id: str) -> Callable[[Any], str | None]:
    """The ``Lever.slower_here`` of an optimizer-state lever: :func:`slower_than_multi_tensor`
    on the target's optimizer and the device of its model's parameters."""

    def slower_here(target: Any) -> str | None:
        first = next(iter(target.model.parameters()), None)
        device = first.device.type if first is not None else "cpu"
        return slower_than_multi_tensor(target.optimizer, device, lever_id)

    return slower_here


def inner_groups(optimizer: torch.optim.Optimizer) -> list[dict[str, Any]]:
    """The param groups to build the torchao optimizer with: the same Parameters, the current
    hyper-parameters (as plain floats: torchao keeps lr as a tensor of its own)."""
    return [
        {
            "params": list(g["params"]),
            "lr": float(g["lr"]),  # sync point when lr is a device tensor
            "betas": tuple(float(b) for b in g["betas"]),
            "eps": float(g["eps"]),
            "weight_decay": float(g["weight_decay"]),
        }
        for g in optimizer.param_groups
    ]


def sync_hyperparameters(outer: torch.optim.Optimizer, inner: torch.optim.Optimizer) -> None:
    """Copy the user's current lr, betas, eps and weight decay into torchao's groups."""
    same = len(outer.param_groups) == len(inner.param_groups) and all(
        len(o["params"]) == len(i["params"])
        and all(a is b for a, b in zip(o["params"], i["params"]))
        for o, i in zip(outer.param_groups, inner.param_groups)
    )
    if not same:
        raise RuntimeError(
            "the optimizer's parameter groups changed after an optimizer-state lever was "
            "applied (add_param_group?): undo the lever, change the groups, and apply it again"
        )
    for o, i in zip(outer.param_groups, inner.param_groups):
        lr = o["lr"]
        if isinstance(lr, torch.Tensor):
            lr = float(lr)  # sync point when the user's lr is a device tensor
        i["lr"].fill_(lr)  # torchao keeps lr as a tensor: set in place, never replaced
        i["betas"] = tuple(float(b) for b in o["betas"])
        i["eps"] = float(o["eps"])
        i["weight_decay"] = float(o["weight_decay"])


def seed_state(outer: torch.optim.Optimizer, inner: Any) -> None:
    """Carry an optimizer's existing moments and step counts into the torchao state."""
    for group in outer.param_groups:
        for p in group["params"]:
            old = outer.state.get(p)
            if not old or "exp_avg" not in old:
                continue
            exp_avg = inner._new_buffer(p, True)
            exp_avg_sq = inner._new_buffer(p, False)
            exp_avg.copy_(old["exp_avg"])  # a cast to bf16, or torchao's quantization
            exp_avg_sq.copy_(old["exp_avg_sq"])
            step = torch.tensor(float(old["step"]), dtype=torch.float32)  # sync point
            inner.state[p] = {"step": step, "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq}


def park(state: dict[Any, dict[str, Any]], *, on_cpu_too: bool = False) -> Callable[[], None]:
    """Copy the state's device tensors to the host and free their device storage; returns the
    undo that refills the same storages, bitwise. CPU tensors are left (nothing to free) unless
    ``on_cpu_too`` (the tests' way to run it on a CPU)."""
    parked = []
    for values in state.values():
        for value in values.values():
            if type(value) is not torch.Tensor:  # torchao's state is never parked: it is new
                continue
            if value.device.type == "cpu" and not on_cpu_too:
                continue
            storage = value.untyped_storage()
            if storage.nbytes() == 0:
                continue
            host = value.detach().to("cpu", copy=True)
            parked.append((value, storage, storage.nbytes(), host))
            storage.resize_(0)

    def refill() -> None:
        for value, storage, nbytes, host in parked:
            storage.resize_(nbytes)
            with torch.no_grad():
                value.copy_(host)
        parked.clear()

    return refill


def unhooked_step(inner: torch.optim.Optimizer) -> Callable[..., Any]:
    """The torchao optimizer's own update, without the hooks its class's ``step`` was wrapped in
    (the user's optimizer runs them once, around it)."""
    step = type(inner).step
    return step.__wrapped__ if getattr(step, "hooked", False) else step


def swap(optimizer: torch.optim.Optimizer, inner: torch.optim.Optimizer, lever_id: str) -> Undos:
    """Put ``inner`` (a torchao optimizer over the same parameters) behind ``optimizer``;
    returns the undo. See the module docstring."""
    undos = Undos()
    seed_state(optimizer, inner)
    undos.add(park(optimizer.state))
    undos.set_attr(optimizer, "state", inner.state)
    update = unhooked_step(inner)

    def run(opt: torch.optim.Optimizer, closure: Callable[[], Any] | None = None) -> Any:
        sync_hyperparameters(opt, inner)
        inner.state = opt.state  # what load_state_dict put there, if it ran since
        return update(inner, closure)

    hooked = torch.optim.Optimizer.profile_hook_step(run)

    def step(closure: Callable[[], Any] | None = None) -> Any:
        optimizer._opt_called = True  # what LRScheduler's wrapper of step sets
        return hooked(optimizer, closure)

    step._wrapped_by_lr_sched = True  # type: ignore[attr-defined]
    step.inner = inner  # type: ignore[attr-defined]  # what runs the update: for a reader
    undos.set_attr(optimizer, "_opt_called", getattr(optimizer, "_opt_called", False))
    undos.set_attr(optimizer, "step", step)
    undos.set_attr(optimizer, MARK, lever_id)
    return undos


def state_nbytes(optimizer: torch.optim.Optimizer, *, moments_only: bool = False) -> int:
    """The bytes the optimizer's state holds: a tensor subclass (torchao's 8-bit state) counted
    by the tensors it is made of (codes, scales, the quantization map). ``moments_only`` leaves
    out the step counters."""
    total = 0
    for values in optimizer.state.values():
        for key, value in values.items():
            if moments_only and key == "step":
                continue
            if isinstance(value, torch.Tensor):
                total += tensor_nbytes(value)
    return total

