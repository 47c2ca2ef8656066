"""levers: find, fix and prove the speed and memory levers of a PyTorch training step."""

from levers.workload import Workload

__version__ = "0.1.0"

__all__ = ["Workload", "__version__"]
