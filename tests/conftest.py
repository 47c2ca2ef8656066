"""Shared test configuration.

Tests marked ``gpu`` need a CUDA device. Each should also carry its own ``skipif``; this hook is
the safety net that makes a forgotten one skip visibly on a CPU instead of failing or, worse,
passing without having run.
"""

from __future__ import annotations

import os

import pytest
import torch

from levers.optional import torchvision_without_ops

# timm's models without torchvision's compiled operators, which PyPI's torchvision (built for a
# CUDA torch) cannot load beside the CPU torch of CI (levers.optional.import_timm)
os.environ.setdefault("LEVERS_TORCHVISION_WITHOUT_OPS", "1")
torchvision_without_ops()  # before a test imports transformers, which imports torchvision

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


@pytest.fixture
def graph_marks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The step starts marked for inductor's CUDA graphs
    (``torch.compiler.cudagraph_mark_step_begin``), one 1 per mark, none made for real."""
    marks: list[int] = []
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append(1))
    return marks


@pytest.fixture
def compile_calls(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """The keyword arguments of each ``nn.Module.compile`` call, which still compiles."""
    calls: list[dict] = []
    compile_ = torch.nn.Module.compile
    monkeypatch.setattr(torch.nn.Module, "compile",
                        lambda self, **kw: (calls.append(kw), compile_(self, **kw)))
    return calls


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


# the optional packages a test may need (pyproject's extras); a test that reaches one that is not
# installed is skipped, visibly, with what to install, rather than failed
OPTIONAL_PACKAGES = ("transformers", "torchao", "liger_kernel", "timm", "lightning", "accelerate")


def _missing_optional(exc: BaseException | None) -> str | None:
    """The optional package whose absence ``exc`` (or the error it was raised from: a factory
    that failed to import it) reports, or None (a real failure)."""
    import importlib.util

    from levers.errors import MissingDependency

    seen = 0
    while exc is not None and seen < 5:
        text = str(exc)
        names: list[str] = []
        if isinstance(exc, ModuleNotFoundError):
            names = [(exc.name or "").split(".")[0]]
        elif isinstance(exc, MissingDependency):
            names = [n for n in OPTIONAL_PACKAGES if n.replace("_", "-") in text or n in text]
        for name in names:
            if name in OPTIONAL_PACKAGES and importlib.util.find_spec(name) is None:
                return name
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    try:
        return (yield)
    except (ModuleNotFoundError, Exception) as exc:  # noqa: BLE001 - re-raised unless optional
        missing = _missing_optional(exc)
        if missing is None:
            raise
        pytest.skip(f"needs {missing}, which is not installed: {exc}")
