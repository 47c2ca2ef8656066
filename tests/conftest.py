"""Shared test configuration.

Tests marked ``gpu`` need a CUDA device. Each should also carry its own ``skipif``; this hook is
the safety net that makes a forgotten one skip visibly on a CPU instead of failing or, worse,
passing without having run.
"""

from __future__ import annotations

import pytest
import torch

# the hand-built capture's fixtures, for the audit's summary and the capture's JSON tests
from hand_capture import build_capture, capture  # noqa: F401


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (marked gpu); run on a GPU machine")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)
