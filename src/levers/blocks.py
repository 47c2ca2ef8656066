"""The repeated blocks of a model: one definition for the audit, the memory model and the levers.

A model's repeated blocks are the children of an ``nn.ModuleList`` or ``nn.Sequential`` that holds
at least two modules, all of one class: a decoder's ``model.layers``, timm's ``blocks``, a ViT
encoder's ``encoder.layer``. Only the outermost such container counts: a block that itself holds a
``ModuleList`` of its own (experts, say) is one block, not many.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

CONTAINERS = (torch.nn.ModuleList, torch.nn.Sequential)


@dataclass(frozen=True)
class Block:
    path: str  # "model.layers.3"
    container: str  # "model.layers"
    index: int
    module: torch.nn.Module


def repeated_blocks(model: torch.nn.Module) -> list[Block]:
    """Every repeated block of ``model``, in module order."""
    found: list[Block] = []
    taken: list[str] = []  # containers found so far; nothing inside them is looked at again
    for name, module in model.named_modules():
        if any(name == c or name.startswith(c + ".") for c in taken):
            continue
        if not isinstance(module, CONTAINERS) or len(module) < 2:
            continue
        if len({type(child) for child in module.children()}) != 1:
            continue
        taken.append(name)
        for index, (child_name, child) in enumerate(module.named_children()):
            path = f"{name}.{child_name}" if name else child_name
            found.append(Block(path=path, container=name, index=index, module=child))
    return found


def block_containers(model: torch.nn.Module) -> list[str]:
    """The module paths of the containers that hold repeated blocks (``["model.layers"]``)."""
    return list(dict.fromkeys(block.container for block in repeated_blocks(model)))


def block_of(module_path: str | None, containers: list[str] | tuple[str, ...]) -> str | None:
    """The block a module path lies in (``"model.layers.3.mlp"`` -> ``"model.layers.3"``), or None."""
    if not module_path:
        return None
    for container in containers:
        prefix = container + "." if container else ""
        if module_path.startswith(prefix):
            rest = module_path[len(prefix) :]
            match = re.match(r"[^.]+", rest)
            if match:
                return prefix + match.group(0)
    return None

