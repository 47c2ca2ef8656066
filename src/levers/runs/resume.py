"""Resume checks: what must hold after loading a checkpoint and before the first step.

- **Seed.** A resume that reuses the checkpoint's seed replays the data order the checkpoint
  already consumed (the shuffle is drawn from the seed). The new seed must differ, or the user
  says why it may not.
- **Optimizer step tensors.** Fused and capturable Adam/AdamW keep each parameter's ``step`` as a
  tensor on the parameter's device, and their kernels fail (``state_steps ... is on cpu``) or sync
  when it is elsewhere. ``Optimizer.load_state_dict`` re-casts it to the parameter's device, but
  a loader that writes ``optimizer.state`` directly (a sharded or consolidated checkpoint format)
  may leave it on the CPU. :func:`misplaced_step_tensors` finds those;
  :func:`rehome_step_tensors` moves them.
- **Counters.** The step counter, each parameter group's learning rate and the scheduler's
  state must equal the checkpoint's: a resume that restarts the schedule silently trains at the
  wrong learning rate.
- **Dataset banner.** The counts a run declares (datasets, episodes, frames, ...) must equal what
  the data pipeline reports, before step 1.

Each check returns a :class:`CheckResult` (passed or not, and why) and never changes training
state; only :func:`rehome_step_tensors` moves tensors, and only when called.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import torch

from levers.errors import LeversError


class ResumeError(LeversError):
    """A resume check failed: the run must not start as it is."""


class BannerMismatch(LeversError):
    """The dataset banner differs from the counts the run declared."""


@dataclass(frozen=True)
class CheckResult:
    check: str  # "seed", "optimizer_step_devices", "step", "learning_rate", "scheduler", "banner"
    passed: bool
    message: str
    values: dict[str, Any]


def check_seed(seed: int, checkpoint_seed: int, *, reason: str | None = None) -> CheckResult:
    """The resumed run's seed differs from the checkpoint's, or ``reason`` says why it may not."""
    values = {"seed": seed, "checkpoint_seed": checkpoint_seed, "reason": reason}
    if seed != checkpoint_seed:
        return CheckResult(
            "seed",
            True,
            f"seed {seed} differs from the checkpoint's {checkpoint_seed}",
            values,
        )
    if reason:
        return CheckResult("seed", True, f"seed {seed} reused on purpose: {reason}", values)
    return CheckResult(
        "seed",
        False,
        f"the resume reuses the checkpoint's seed {seed}: the data order replays what the "
        "checkpoint already consumed. Pass a new seed, or give the reason the seed must stay "
        "(seed_reuse_reason=...)",
        values,
    )


def _device_state(group: Mapping[str, Any]) -> bool:
    # these keep `step` on the parameter's device; the foreach/for-loop paths keep it on the CPU
    return bool(group.get("fused")) or bool(group.get("capturable"))


def misplaced_step_tensors(optimizer: torch.optim.Optimizer) -> list[dict[str, Any]]:
    """Each fused/capturable parameter whose ``step`` tensor is not on the parameter's device."""
    found = []
    for group_index, group in enumerate(optimizer.param_groups):
        if not _device_state(group):
            continue
        for param_index, param in enumerate(group["params"]):
            step = optimizer.state.get(param, {}).get("step")
            if isinstance(step, torch.Tensor) and step.device != param.device:
                found.append(
                    {
                        "group": group_index,
                        "param": param_index,
                        "step_device": str(step.device),
                        "param_device": str(param.device),
                    }
                )
    return found


def rehome_step_tensors(optimizer: torch.optim.Optimizer) -> int:
    """Move misplaced ``step`` tensors of fused/capturable groups to their parameter's device.

    The value is kept (as float32, what those kernels take). Returns how many were moved; call
    it after ``load_state_dict`` and before the first ``optimizer.step()``.
    """
    moved = 0
    for group in optimizer.param_groups:
        if not _device_state(group):
            continue
        for param in group["params"]:
            state = optimizer.state.get(param)
            step = None if state is None else state.get("step")
            if isinstance(step, torch.Tensor) and step.device != param.device:
                state["step"] = step.to(device=param.device, dtype=torch.float32)
                moved += 1
    return moved


def check_optimizer_step_devices(optimizer: torch.optim.Optimizer) -> CheckResult:
    found = misplaced_step_tensors(optimizer)
    if not found:
        return CheckResult(
            "optimizer_step_devices",
            True,
            "every fused/capturable step tensor is on its parameter's device",
            {},
        )
    first = found[0]
    return CheckResult(
        "optimizer_step_devices",
        False,
        f"{len(found)} fused/capturable optimizer step tensor(s) are not on their parameter's "
        f"device (the first: group {first['group']} param {first['param']} on "
        f"{first['step_device']}, parameter on {first['param_device']}); the first "
        "optimizer.step() would fail. Move them with levers.rehome_step_tensors(optimizer) after "
        "loading the checkpoint (or pass fix=True)",
        {"misplaced": found},
    )


def check_step(step: int, checkpoint_step: int) -> CheckResult:
    values = {"step": step, "checkpoint_step": checkpoint_step}
    if step == checkpoint_step:
        return CheckResult("step", True, f"step counter {step} matches the checkpoint", values)
    return CheckResult(
        "step",
        False,
        f"the step counter is {step}, the checkpoint's is {checkpoint_step}: restore the step "
        "from the checkpoint before training",
        values,
    )


def check_learning_rates(
    optimizer: torch.optim.Optimizer, checkpoint_optimizer_state: Mapping[str, Any]
) -> CheckResult:
    """Each param group's lr equals the one in the checkpoint's ``optimizer.state_dict()``."""
    current = [group["lr"] for group in optimizer.param_groups]
    saved = [group.get("lr") for group in checkpoint_optimizer_state.get("param_groups", [])]
    values = {"lr": [float(v) for v in current], "checkpoint_lr": saved}
    if len(current) != len(saved):
        return CheckResult(
            "learning_rate",
            False,
            f"the optimizer has {len(current)} param group(s), the checkpoint {len(saved)}",
            values,
        )
    differ = [i for i, (a, b) in enumerate(zip(current, saved)) if float(a) != float(b)]
    if not differ:
        return CheckResult("learning_rate", True, "learning rates match the checkpoint", values)
    i = differ[0]
    return CheckResult(
        "learning_rate",
        False,
        f"param group {i} trains at lr {float(current[i]):g}, the checkpoint saved "
        f"{float(saved[i]):g}: load the optimizer's and the scheduler's state, in that order",
        values,
    )


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and torch.equal(a.cpu(), b.cpu())
        )
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def check_scheduler(scheduler: Any, checkpoint_scheduler_state: Mapping[str, Any]) -> CheckResult:
    """The scheduler's ``state_dict()`` equals the checkpoint's, key by key."""
    current = scheduler.state_dict()
    keys = sorted(set(current) | set(checkpoint_scheduler_state))
    differ = [
        k
        for k in keys
        if k not in current
        or k not in checkpoint_scheduler_state
        or not _same(current[k], checkpoint_scheduler_state[k])
    ]
    values = {
        "differing_keys": differ,
        "last_epoch": current.get("last_epoch"),
        "checkpoint_last_epoch": checkpoint_scheduler_state.get("last_epoch"),
    }
    if not differ:
        return CheckResult("scheduler", True, "scheduler state matches the checkpoint", values)
    return CheckResult(
        "scheduler",
        False,
        f"the scheduler's state differs from the checkpoint's in {differ} (last_epoch "
        f"{values['last_epoch']} vs {values['checkpoint_last_epoch']}): call "
        "scheduler.load_state_dict(checkpoint's scheduler state)",
        values,
    )


def check_banner(declared: Mapping[str, int], observed: Mapping[str, int]) -> CheckResult:
    """Every declared count equals the observed one; observed counts not declared are listed."""
    differ = {
        key: {"declared": want, "observed": observed.get(key)}
        for key, want in declared.items()
        if observed.get(key) != want
    }
    undeclared = sorted(set(observed) - set(declared))
    values = {"declared": dict(declared), "observed": dict(observed), "differ": differ}
    if undeclared:
        values["undeclared"] = undeclared
    if not differ:
        return CheckResult("banner", True, "the dataset banner matches the declared counts", values)
    words = ", ".join(
        f"{key} {'missing' if d['observed'] is None else d['observed']} "
        f"(declared {d['declared']})"
        for key, d in differ.items()
    )
    return CheckResult(
        "banner",
        False,
        f"the dataset banner differs from the declared counts: {words}. Stop and find out why "
        "(a filtered or missing dataset); if the new counts are right, amend the declaration",
        values,
    )
