"""How a source file is named in every report: one spelling for the tables and the receipts.

Relative to the current directory when inside it; a file of an installed package from its
``site-packages`` folder on (``transformers/models/llama/modeling_llama.py``); else as it is.
"""

from __future__ import annotations

import os


def display_path(path: str) -> str:
    if not path or not os.path.isabs(path):
        return path
    marker = f"{os.sep}site-packages{os.sep}"
    if marker in path:
        return path.rsplit(marker, 1)[1]
    try:
        rel = os.path.relpath(path)
    except ValueError:  # another drive on Windows
        return path
    return path if rel.startswith("..") else rel
