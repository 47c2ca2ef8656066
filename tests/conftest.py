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


@pytest.fixture(autouse=True)
def _fresh_gpu(request: pytest.FixtureRequest):
    """Each GPU test starts from a GPU the tests before it have let go of: compiled programs and
    their CUDA-graph pools dropped, garbage collected, the allocator's cache emptied. A test that
    measures allocated or reserved bytes otherwise reads what earlier tests in the process left
    (on the H200 such tests passed alone and failed in the full GPU run)."""
    if request.node.get_closest_marker("gpu") is None or not torch.cuda.is_available():
        yield
        return
    _release_gpu()
    yield
    _release_gpu()


def _release_gpu() -> None:
    import gc

    torch._dynamo.reset()  # compiled code and the CUDA-graph trees' memory pools
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (marked gpu); run on a GPU machine")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)
