"""The ``levers`` command line: the only command-line code, one module per verb named after it
(:mod:`audit`, :mod:`memory`, :mod:`ab`, :mod:`compare`, :mod:`prereg`, :mod:`list`, :mod:`rule`,
and :mod:`script` for the ``-- python train.py`` form), wired together by :mod:`command`."""

from levers.cli.command import EXIT_INTERNAL_ERROR, EXIT_INTERRUPTED, build_parser, main

__all__ = ["EXIT_INTERNAL_ERROR", "EXIT_INTERRUPTED", "build_parser", "main"]
