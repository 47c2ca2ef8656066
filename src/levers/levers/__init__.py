"""The lever catalogue: one lever per file, registered here by id.

``REGISTRY`` maps a lever id to its :class:`levers.levers.lever.Lever`. A lever module calls
:func:`register` at import; the modules are listed in ``_MODULES`` and imported on first use.

Every audit imports the whole catalogue (:func:`load_all`), so a lever module imports the memory
model (:mod:`levers.memory.predict`, ``prediction``, ``fit``: a few tenths of a second, and the
terminal code its error messages use) inside the functions that predict, not at its top.
"""

from __future__ import annotations

import importlib

from levers.levers.lever import Lever

# one module per lever, imported when the catalogue is first read
_MODULES: tuple[str, ...] = (
    "rms_norm_fused",
    "sdpa_cudnn_backend",
    "sdpa_attention",
    "experts_grouped_mm",
    "grouped_mm_autocast",
    "loss_valid_rows",
    "inplace_scatter",
    "windowed_peak_metric",
    "fused_optimizer",
    "adamw_bf16_state",
    "adamw_8bit",
    "autocast_bf16",
    "fused_linear_cross_entropy",
    "liger_kernels",
    "channels_last",
    "compile_blocks",
    "compile_model",
    "compile_loss",
    "float8",
    "float8_rowwise",
    "raise_batch",
    "ac_full",
    "ac_selective",
    "ac_budget",
    "packing",
    "padding_free",
    "pad_to_multiple",
)

REGISTRY: dict[str, Lever] = {}


def register(lever: Lever) -> Lever:
    if lever.id in REGISTRY and REGISTRY[lever.id] is not lever:
        raise ValueError(f"lever id {lever.id!r} is registered twice")
    REGISTRY[lever.id] = lever
    return lever


def load_all() -> dict[str, Lever]:
    """Every lever of the catalogue, by id (imports the lever modules on first use)."""
    for name in _MODULES:
        importlib.import_module(f"levers.levers.{name}")
    return REGISTRY
