"""``python -m trainer.bench`` (trainer.bench.drafter_step)."""

import sys

from .drafter_step import main

if __name__ == "__main__":
    sys.exit(main())
