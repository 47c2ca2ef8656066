"""The zoo's tests share the lever parity helpers of tests/levers."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "levers"))
