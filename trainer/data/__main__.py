"""``python -m trainer.data {synth,tokenize,regenerate}`` (trainer.data.cli)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
