"""The repeated blocks of a model: one definition for the audit, the memory model and the levers.

A model's repeated blocks are the children of an ``nn.ModuleList`` or ``nn.Sequential`` that holds
at least two modules, all of one class: a decoder's ``model.layers``, timm's ``blocks``, a ViT
encoder's ``encoder.layer``. Only the outermost such container counts: a block that itself holds a
``ModuleList`` of its own (experts, say) is one block, not many.
"""

from __future__ import annotations

import ast
import functools
import inspect
import re
import textwrap
from dataclasses import dataclass

import torch

_CONTAINERS = (torch.nn.ModuleList, torch.nn.Sequential)


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
        if not isinstance(module, _CONTAINERS) or len(module) < 2:
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


def forward_called_directly(
    model: torch.nn.Module, units: list[torch.nn.Module]
) -> str | None:
    """Where the model calls the ``forward`` of one of ``units`` by name (``layer.forward(x)``),
    in words, or None. Such a call skips the module call (``layer(x)``), and with it what hooks
    into that call: ``module.compile()`` compiles the module call, so a block called this way
    runs uncompiled (transformers' SqueezeBERT encoder: ``for layer in self.layers:
    layer.forward(...)``). Read from the source of the forward of the module that holds the
    units (their container's owner): a loop over the container whose variable's ``forward`` is
    called or handed on (``checkpoint(layer.forward, x)``), or ``self.<container>[i].forward``."""
    parents: dict[int, tuple[str, torch.nn.Module]] = {}
    for module in model.modules():
        for child_name, child in module.named_children():
            parents.setdefault(id(child), (child_name, module))
    looked: set[tuple[type, str]] = set()
    for unit in units:
        if id(unit) not in parents:
            continue
        name, holder = parents[id(unit)]
        if isinstance(holder, _CONTAINERS) and id(holder) in parents:
            name, holder = parents[id(holder)]
        key = (type(holder), name)
        if key in looked:
            continue
        looked.add(key)
        call = _direct_forward_call(type(holder), name)
        if call is not None:
            return f"{type(holder).__name__}.forward calls its blocks' forward by name ({call})"
    return None


@functools.lru_cache(maxsize=256)
def _direct_forward_call(owner: type, attribute: str) -> str | None:
    """The first use in ``owner.forward`` of ``X.forward`` where X is a loop variable over
    ``self.<attribute>`` (or ``self.<attribute>[...]`` itself), called or handed on (to a
    checkpoint, say), as source text; None where there is none or the source cannot be read."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(owner.forward)))
    except (OSError, TypeError, SyntaxError, AttributeError):
        return None

    def over_container(node: ast.AST) -> bool:  # self.<attribute>, or a subscript of it
        while isinstance(node, ast.Subscript):
            node = node.value
        return (isinstance(node, ast.Attribute) and node.attr == attribute
                and isinstance(node.value, ast.Name) and node.value.id == "self")

    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.For) and any(over_container(n) for n in ast.walk(node.iter)):
            names |= {n.id for n in ast.walk(node.target) if isinstance(n, ast.Name)}
    calls = {id(node.func) for node in ast.walk(tree) if isinstance(node, ast.Call)}
    for node in ast.walk(tree):
        # a call of X.forward, or X.forward handed on (checkpoint(layer.forward, x))
        if not (isinstance(node, ast.Attribute) and node.attr == "forward"):
            continue
        owner = node.value
        if (isinstance(owner, ast.Name) and owner.id in names) or over_container(owner):
            return ast.unparse(node) + ("(...)" if id(node) in calls else "")
    return None
