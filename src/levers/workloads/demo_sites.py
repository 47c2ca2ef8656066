"""Where each inefficiency of the ``demo`` workload lives in the source.

Each site is the first code line after a ``# [demo:<flag>]`` comment in one of the demo's files,
so the answer follows the code when it moves. Detector tests use it to check their receipts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from levers.workloads.demo_config import FLAGS

_MARKER = re.compile(r"^\s*# \[demo:(\w+)\]")
_FILES = ("demo.py", "demo_model.py", "demo_vision.py", "demo_text.py", "demo_loss.py")


@dataclass(frozen=True)
class Site:
    path: str  # absolute path of the source file
    line: int  # 1-based line number
    function: str  # the enclosing function, e.g. "TextDecoder.prefix"


def inefficiency_sites() -> dict[str, tuple[Site, ...]]:
    """Map each flag in :data:`FLAGS` to the source lines that hold its inefficiency."""
    sites: dict[str, list[Site]] = {flag: [] for flag in FLAGS}
    for name in _FILES:
        path = Path(__file__).with_name(name)
        lines = path.read_text().splitlines()
        for index, text in enumerate(lines):
            match = _MARKER.match(text)
            if match is None:
                continue
            flag = match.group(1)
            assert flag in sites, f"unknown flag {flag!r} in a marker at {path}:{index + 1}"
            code_index = _next_code_line(lines, index + 1)
            sites[flag].append(
                Site(str(path), code_index + 1, _enclosing_function(lines, code_index))
            )
    return {flag: tuple(found) for flag, found in sites.items()}


def _next_code_line(lines: list[str], start: int) -> int:
    index = start
    while lines[index].lstrip().startswith("#"):
        index += 1
    return index


def _enclosing_function(lines: list[str], index: int) -> str:
    """The dotted name of the def (and class) around a line, e.g. ``TextDecoder.prefix``."""
    names = []
    indent = len(lines[index]) - len(lines[index].lstrip())
    for text in reversed(lines[:index]):
        stripped = text.lstrip()
        level = len(text) - len(stripped)
        if stripped.startswith(("def ", "class ")) and level < indent:
            names.append(stripped.split()[1].split("(")[0].rstrip(":"))
            indent = level
    return ".".join(reversed(names)) or "<module>"
