"""Recording one training step: op records, module tracking, source lines, GPU kernels, memory."""

from levers.capture.records import Capture
from levers.capture.step import capture_step

__all__ = ["Capture", "capture_step"]
