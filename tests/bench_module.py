"""A bench/ script loaded as a module, for the tests of the benchmarks (bench/ is no package)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[1] / "bench"


def bench_module(filename: str, name: str) -> ModuleType:
    """``bench/<filename>`` executed afresh as module ``name``."""
    spec = importlib.util.spec_from_file_location(name, BENCH / filename)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
