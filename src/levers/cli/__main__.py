"""``python -m levers.cli``: the ``levers`` command (as ``python -m levers``)."""

import sys

from levers.cli.command import main

if __name__ == "__main__":
    sys.exit(main())
