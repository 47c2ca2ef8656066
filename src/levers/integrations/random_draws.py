"""Whether a model's forward draws random numbers, seen from torch's default generators.

A compiled program of a model with dropout draws its masks with inductor's own random-number
code, so a correct compiled side differs from eager by its masks; its parity steps run with
eager's random ops (:func:`levers.ab.random_alike.drawn_alike`), and what was compiled so is
compiled again for the timed steps only where the model draws random numbers
(:func:`levers.ab.random_alike.recompile_for_timing`). A factory's A/B learns that from its
float64 run; a script has none, so its first run without levers watches the model's forward.

:class:`ForwardDraws` compares the state of the default generators (the CPU's, and each CUDA
device's that is initialised) before and after each call of the model's forward: a draw there
(``nn.Dropout``, ``F.dropout``, attention's ``dropout_p``, ``torch.rand`` in a forward) moves
them; the batches a script draws before it calls the model do not count, and neither do random
numbers drawn in a compiled program by inductor's own code (the run that watches applies no
levers). It costs a copy of the CPU generator's state (5 KB) and reads each CUDA generator's
seed and offset (no device sync) per forward.

Known limits: a draw from a generator of the script's own (``torch.rand(..., generator=g)``) is
not seen; a forward that draws on some steps only is seen on the steps watched; a forward that
is never called through the module (``model.forward(x)``) is not watched, and neither compile
lever changes it there either.
"""

from __future__ import annotations

from typing import Any

import torch


def _states() -> tuple[Any, ...]:
    states: list[Any] = [torch.random.default_generator.get_state()]
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states += [torch.cuda.get_rng_state(i) for i in range(torch.cuda.device_count())]
    return tuple(states)


def _moved(before: tuple[Any, ...], after: tuple[Any, ...]) -> bool:
    return len(before) != len(after) or any(
        not torch.equal(a, b) for a, b in zip(before, after)
    )


class ForwardDraws:
    """Counts the calls of ``model``'s forward and those that drew random numbers, while on.

        with ForwardDraws(model) as draws:
            ...                      # the script's steps
        draws.drew                   # True, False, or None (no forward seen)
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.num_forwards = 0
        self.num_drew = 0
        self._before: list[tuple[Any, ...]] = []  # a stack: a forward may call itself
        self._handles: list[Any] = []

    @property
    def drew(self) -> bool | None:
        """Whether a watched forward drew random numbers; None when none was watched."""
        return None if self.num_forwards == 0 else self.num_drew > 0

    def __enter__(self) -> ForwardDraws:
        def before(module: torch.nn.Module, args: object) -> None:
            self._before.append(_states())

        def after(module: torch.nn.Module, args: object, output: object) -> None:
            if not self._before:  # installed between a forward's start and its end
                return
            self.num_forwards += 1
            self.num_drew += _moved(self._before.pop(), _states())

        self._handles = [
            self.model.register_forward_pre_hook(before),
            self.model.register_forward_hook(after),
        ]
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self._before = []
