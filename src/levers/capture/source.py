"""Source locations: the innermost frame of the user's code on the current stack.

"User code" is defined once, in :mod:`levers.user_code`.
"""

from __future__ import annotations

import linecache
import os
import sys
from types import CodeType, FrameType

import torch

from levers.capture.records import SourceLoc
from levers.user_code import is_user_file

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_CHECKPOINT_FILE = os.path.join(_TORCH_DIR, "utils", "checkpoint.py")

# (code object, line) -> SourceLoc; code objects live as long as their functions
_cache: dict[tuple[CodeType, int], SourceLoc] = {}
# code object -> whether it is user code: one lookup per frame of every op's stack walk (a
# filename would need the code's co_filename first)
_user_code: dict[CodeType, bool] = {}
_MAX_CACHED = 100_000


def _loc(frame: FrameType) -> SourceLoc:
    code = frame.f_code
    line = frame.f_lineno
    key = (code, line)
    loc = _cache.get(key)
    if loc is None:
        text = linecache.getline(code.co_filename, line).strip()
        loc = SourceLoc(file=code.co_filename, line=line, function=code.co_name, code=text)
        _cache[key] = loc
    return loc


def user_frame(start: FrameType | None = None) -> SourceLoc | None:
    """The innermost user frame on the stack, or None when there is none."""
    frame = start if start is not None else sys._getframe(1)
    user_code = _user_code
    while frame is not None:
        code = frame.f_code
        user = user_code.get(code)
        if user is None:
            if len(user_code) > _MAX_CACHED:
                user_code.clear()
            user = user_code[code] = is_user_file(code.co_filename)
        if user:  # _loc(frame), inlined: this runs for every op
            line = frame.f_lineno
            loc = _cache.get((code, line))
            return loc if loc is not None else _loc(frame)
        frame = frame.f_back
    return None


_OVERRIDES_FILE = os.path.join(_TORCH_DIR, "overrides.py")
_DATA_DIR = os.path.join(_TORCH_DIR, "utils", "data") + os.sep


def called_from_torch(func_name: str) -> bool:
    """Whether the code that called torch function ``func_name`` is torch's own.

    Called from a ``__torch_function__`` handler. Frames of torch's dispatch to the handler
    (``torch/overrides.py``), of the Python wrapper of the function itself, and of any other
    ``__torch_function__`` handler between them (two modes stacked: the call reaches this one
    through the other's handler) are skipped.
    """
    frame = sys._getframe(2)
    while frame is not None:
        filename = os.path.abspath(frame.f_code.co_filename)
        in_torch = filename.startswith(_TORCH_DIR)
        name = frame.f_code.co_name
        if filename == _OVERRIDES_FILE or name == "__torch_function__" or (
            in_torch and name == func_name
        ):
            frame = frame.f_back
            continue
        return in_torch
    return False


def in_data_pipeline() -> bool:
    """Whether the stack runs through torch's data loading (a DataLoader fetching a batch: a
    Dataset's ``__getitem__``, a collate function): host-side work on host tensors, which waits
    for no GPU whatever device the model runs on."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_filename.startswith(_DATA_DIR):
            return True
        frame = frame.f_back
    return False


def in_checkpoint_recompute() -> bool:
    """True when the stack runs through torch.utils.checkpoint (a recomputation in backward)."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_filename == _CHECKPOINT_FILE:
            return True
        frame = frame.f_back
    return False
