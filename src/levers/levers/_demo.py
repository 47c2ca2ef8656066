"""The ``demo`` workload's code-level fixes, switched on a live model.

Some fixes are edits to user code (gather the real rows before the head, drop a clone before a
scatter): no patch can make them in arbitrary code. The built-in ``demo`` carries each as a switch
in the frozen ``fixes`` dataclass its modules read at every forward, so a lever can turn it on in
a model that is already built, with the same effect as building it with ``fixed=<flag>``.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import torch

from levers.levers._find import demo_switches
from levers.levers._patch import Undos


def has_switch(model: torch.nn.Module, flag: str) -> bool:
    return next(demo_switches(model, flag), None) is not None


def switch_on(model: torch.nn.Module, flag: str) -> Callable[[], None]:
    undos = Undos()
    for module in list(demo_switches(model, flag)):
        undos.set_attr(module, "fixes", dataclasses.replace(module.fixes, **{flag: True}))
    return undos
