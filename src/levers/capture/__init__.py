"""Recording one training step: op records, module tracking, source lines, GPU kernels, memory."""

from typing import TYPE_CHECKING

from levers.lazy import lazy_attributes

if TYPE_CHECKING:
    from levers.capture.records import Capture
    from levers.capture.step import capture_step

# imported on first read (levers.lazy): `levers --help` imports this package without torch
__getattr__, __dir__ = lazy_attributes(
    __name__,
    globals(),
    {
        "Capture": "levers.capture.records",
        "capture_step": "levers.capture.step",
    },
)

__all__ = ["Capture", "capture_step"]
