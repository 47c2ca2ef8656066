"""``python -m levers``: the ``levers`` command, so that ``torchrun -m levers audit ...`` runs it."""

import sys

from levers.cli.command import main

if __name__ == "__main__":
    sys.exit(main())
