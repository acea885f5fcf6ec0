"""Progress of a long data command (tokenize, regenerate): a bar on a terminal, lines otherwise.

A line is ``LABEL: DONE/TOTAL (R/s)``, with ``, T tok/s`` when the command counts generated
tokens (regenerate); records found done already (a resume) count in DONE, not in the rate; under ``dfo launch`` a ``step_pattern`` reads it (docs/own-trainer.md).
"""

from __future__ import annotations

import sys
import threading
import time

from .tokenized import Summary


class Progress:
    """A tqdm bar on a terminal, plain ``label: done/total`` lines (every few s) otherwise."""

    def __init__(self, total: int | None, label: str, stream=None, every_s: float = 5.0):
        self.total, self.label, self.done = total, label, 0
        self.tokens = 0                  # generated tokens (regenerate), 0 when not counted
        self.skipped = 0                 # of ``done``: found done already (not in the rate)
        self._lock = threading.Lock()    # engines report replies from their threads
        self.stream = stream or sys.stderr
        self.summary = Summary()
        self.every_s = every_s
        self._last = 0.0
        self._t0 = time.monotonic()
        self._bar = None
        if getattr(self.stream, "isatty", lambda: False)():
            try:
                from tqdm import tqdm

                self._bar = tqdm(total=total, desc=label, unit="rec", file=self.stream)
            except ImportError:
                pass

    def update(self, n: int = 1, tokens: int = 0, *, skipped: bool = False) -> None:
        with self._lock:
            self.done += n
            if skipped:
                self.skipped += n
            self.tokens += tokens
            if self._bar is not None:
                if n:
                    self._bar.update(n)
                return
            now = time.monotonic()
            if now - self._last >= self.every_s:
                self._last = now
                self._line()

    def _line(self) -> None:
        tot = f"/{self.total}" if self.total is not None else ""
        dt = max(time.monotonic() - self._t0, 1e-9)
        self._printed = self.done
        tok = f", {self.tokens / dt:.1f} tok/s" if self.tokens else ""
        rate = (self.done - self.skipped) / dt
        print(f"{self.label}: {self.done}{tot} ({rate:.1f}/s{tok})", file=self.stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        elif getattr(self, "_printed", None) != self.done:
            self._line()
