"""``adamw-bf16-state``: Adam/AdamW with its two moments kept in bfloat16, stochastically rounded.

fp32 AdamW keeps two fp32 moments per parameter, 8 bytes per parameter (16 GB for a 2B model);
in bf16 they take 4, half the state. Parameters (the master weights) and gradients stay as they
are.

What torchao 0.18 offers, and why this lever is a thin subclass of it rather than one of its
optimizers: ``torchao.optim._AdamW(bf16_stochastic_round=True)`` keeps its moments in the
*parameter's* dtype (``_new_buffer`` is ``zeros_like(p)`` there, its block size being infinite)
and rounds stochastically only the *parameter* update, and only for bf16 parameters: with fp32
master weights it is fp32 AdamW. There is no bf16 state with fp32 parameters in torchao. And
rounding bf16 moments to nearest stalls them: with beta2 = 0.999 a step moves ``exp_avg_sq`` by
0.1% of itself, under half a bf16 ulp (2^-9, 0.2%), so round-to-nearest writes back the old
value and the second moment can only grow (the failure stochastic rounding exists for;
Zamirai et al., "Revisiting BFloat16 Training", 2020). So this lever's optimizer is
``torchao.optim.adam._AdamBase`` (torchao's constructor, lr kept as a tensor, its per-parameter
loop under ``torch.compile(fullgraph=True)``) with two changes: ``_new_buffer`` makes bf16
moments, and each parameter's update is torchao's own ``single_param_adam`` run on fp32 copies
of the moments, which are then written back through torchao's ``_fp32_to_bf16_sr`` (round away
from zero with the probability of the dropped 16 bits, so the rounding is unbiased and small
increments survive on average). Compiled, the copies are fused into the one kernel per
parameter; nothing fp32 of the state's size is kept between steps. The stochastic rounding draws
from the global RNG (``torch.randint``), so the random stream after an optimizer step is not
the baseline's.

The optimizer the step already holds is kept, and torchao's update is put behind it
(:mod:`levers.levers._optimizer_state`: its ``state`` and ``step`` swapped in place, its
hyper-parameters read at each step, the undo puts back the very state it had).

Fix safety: changes numerics (8-bit-mantissa moments). Tolerance checked against fp32 AdamW
over three steps of the tiny llama, in fp32 on a CPU (tests/levers/test_optimizer_state.py):
1e-3 relative on the losses (measured: 4e-8) and 1e-2 on each parameter's update (measured:
1.7e-3). That is a smoke check of the wiring, not
the proof: its proof is the paired held-out loss of ``levers ab`` (the quality read) over at
least 500 steps (bench/optimizer_state.py runs it on the built-in llama).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
from typing import Any, Callable

import torch

from levers.optional import import_quietly
from levers.levers import register
from levers.levers._optimizer_state import (
    inner_groups,
    is_adamw,
    reason,
    slower_here_of,
    swap,
)
from levers.levers.lever import Lever, Target
from levers.vocab import CHANGES_NUMERICS

ID = "adamw-bf16-state"
TOLERANCE = 1e-3  # on the losses; the test holds each parameter's update to UPDATE_RTOL
UPDATE_RTOL = 1e-2
NEEDS = ("single_param_adam",)  # of torchao.optim.adam, beside _AdamBase
KNOWN_PROBLEMS = (
    "changes numerics: the held-out loss over >= 500 steps (levers ab's quality read) is its "
    "proof; torchao compiles one update per parameter shape (a first step of seconds to "
    "minutes, on a CPU too); the stochastic rounding draws from the global RNG"
)


@functools.cache
def optimizer_class() -> type:
    """torchao's Adam with bf16 moments, stochastically rounded (built on first use: torchao is
    optional)."""
    adam = import_quietly("torchao.optim.adam")
    to_bf16_sr = import_quietly("torchao.optim.quant_utils")._fp32_to_bf16_sr
    single_param_adam = adam.single_param_adam

    def update(
        p: torch.Tensor,
        grad: torch.Tensor,
        step: torch.Tensor,
        exp_avg: torch.Tensor,
        exp_avg_sq: torch.Tensor,
        lr: torch.Tensor,
        beta1: float,
        beta2: float,
        weight_decay: float,
        eps: float,
        decoupled: bool,
    ) -> None:
        # torchao's update in fp32, then its stochastic rounding of the moments back to bf16
        exp_avg_f32, exp_avg_sq_f32 = exp_avg.float(), exp_avg_sq.float()
        single_param_adam(
            p, grad, step, exp_avg_f32, exp_avg_sq_f32, None, lr, beta1, beta2, weight_decay,
            eps, decoupled, False,
        )
        exp_avg.copy_(to_bf16_sr(exp_avg_f32))
        exp_avg_sq.copy_(to_bf16_sr(exp_avg_sq_f32))

    class BF16StateAdam(adam._AdamBase):
        """Adam (``decoupled=False``) or AdamW with bf16 moments; see the module docstring."""

        def __init__(
            self,
            params: Any,
            lr: float = 1e-3,
            betas: tuple[float, float] = (0.9, 0.999),
            eps: float = 1e-8,
            weight_decay: float = 1e-2,
            *,
            decoupled: bool = True,
        ) -> None:
            super().__init__(
                params, lr, betas, eps, weight_decay, False,
                block_size=None, bf16_stochastic_round=False, is_adamw=decoupled,
            )

        def _new_buffer(self, p: torch.Tensor, signed: bool) -> torch.Tensor:
            return torch.zeros_like(p, dtype=torch.bfloat16)

        @torch.no_grad()
        def step(self, closure: Callable[[], Any] | None = None) -> Any:
            # torchao's _AdamBase.step, calling the update above
            loss = None
            if closure is not None:
                with torch.enable_grad():
                    loss = closure()
            compiled = torch.compile(update, fullgraph=True, dynamic=False)
            with torch._dynamo.utils.disable_cache_limit():
                for group in self.param_groups:
                    for p in group["params"]:
                        if p.grad is None:
                            continue
                        if p.grad.is_sparse:
                            raise RuntimeError("Sparse gradient is not supported")
                        state = self.state[p]
                        if len(state) == 0:
                            state["step"] = torch.tensor(0.0)
                            state["exp_avg"] = self._new_buffer(p, True)
                            state["exp_avg_sq"] = self._new_buffer(p, False)
                        state["step"] += 1
                        beta1, beta2 = group["betas"]
                        compiled(
                            p.detach(), p.grad, state["step"], state["exp_avg"],
                            state["exp_avg_sq"], group["lr"], beta1, beta2,
                            group["weight_decay"], group["eps"], self.is_adamw,
                        )
            return loss

    return BF16StateAdam


def applies(target: Target) -> str | None:
    why = reason(target.optimizer, NEEDS)
    if why is not None:
        return why
    params = [p for g in target.optimizer.param_groups for p in g["params"]]
    if all(p.element_size() <= 2 for p in params):
        kinds = ", ".join(sorted({str(p.dtype).removeprefix("torch.") for p in params}))
        return (
            f"its parameters are {kinds}, so Adam's state is already 16-bit (it follows the "
            "parameters' dtype); adamw-8bit shrinks it further"
        )
    if importlib.util.find_spec("torchao.optim.quant_utils") is None:
        return "this torchao has no torchao.optim.quant_utils (its stochastic rounding)"
    return None


def build(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """The torchao optimizer over ``optimizer``'s parameters, with its hyper-parameters."""
    return optimizer_class()(inner_groups(optimizer), decoupled=is_adamw(optimizer))


def patch(target: Target) -> Callable[[], None]:
    assert target.optimizer is not None
    return swap(target.optimizer, build(target.optimizer), ID)


LEVER = register(
    Lever(
        id=ID,
        title="Keep Adam/AdamW's two moments in bf16, stochastically rounded (torchao's update)",
        safety=CHANGES_NUMERICS,
        tolerance=TOLERANCE,
        fixes=("MEM004",),
        applies=applies,
        patch=patch,
        slower_here=slower_here_of(ID),
        # its saving is device memory, which a CPU run does not read (levers tune leaves it out
        # there); it runs on a CPU, torchao compiling its update there too
        needs_gpu=True,
        known_problems=KNOWN_PROBLEMS,
    )
)
