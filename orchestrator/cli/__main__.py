"""``python -m orchestrator.cli``: the same as the ``dfo`` command."""

import sys

from . import main

if __name__ == "__main__":
    sys.exit(main())
