"""The version of levers, defined once: ``levers.__version__`` and the package metadata
(``pyproject.toml`` reads it from here) both come from this module, which imports nothing."""

__version__ = "0.1.0"
