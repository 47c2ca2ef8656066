"""The ``levers`` command line: the only command-line code, one module per verb named after it
(:mod:`audit`, :mod:`memory`, :mod:`ab`, :mod:`compare`, :mod:`prereg`, :mod:`list`, :mod:`rule`,
and :mod:`script` for the ``-- python train.py`` form), wired together by :mod:`command`.

``levers --help`` imports every verb module to build the parser, and must answer without torch
(tests/cli/test_startup.py). So a verb module imports at its top only what the parser loads
anyway; what runs the verb (:mod:`levers.api`, the analyses, their renderers and files) is
imported inside the function that needs it."""

from levers.cli.command import EXIT_INTERNAL_ERROR, EXIT_INTERRUPTED, build_parser, main

__all__ = ["EXIT_INTERNAL_ERROR", "EXIT_INTERRUPTED", "build_parser", "main"]
