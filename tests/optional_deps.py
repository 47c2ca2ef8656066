"""Marks for tests that need an optional package (pyproject's extras).

Most such tests skip on their own: tests/conftest.py turns a missing optional package that a test
reaches (ModuleNotFoundError, levers' MissingDependency) into a visible skip. A test whose
missing package shows only in a subprocess's output carries :func:`needs` instead.
"""

from __future__ import annotations

import pytest


def needs(*packages: str):
    """A mark that skips a test (visibly) unless ``packages`` are installed: for a test whose
    missing package shows only in a subprocess's output."""
    import importlib.util

    missing = [p for p in packages if importlib.util.find_spec(p) is None]
    return pytest.mark.skipif(bool(missing), reason=f"needs {', '.join(missing)}, not installed")

