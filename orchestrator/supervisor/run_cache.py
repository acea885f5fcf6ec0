"""The run's own compile cache (``<run-dir>/cache``), as the supervisor keeps it.

- seeded from the host's live cache once this supervisor owns the run (never by the
  launch: a launch cut off before the start leaves no copy behind);
- after a failed attempt: scrubbed of what cannot be loaded (empty files, cut-short shared
  objects), or cleared when the attempt died at start-up loading a shared object from it
  (``ops.cache_check``);
- topped up from the host's live cache by a fallback that restores it.

Each step's outcome is a ``cache_restore`` event.
"""

from __future__ import annotations

import os
import subprocess
from typing import TYPE_CHECKING, Callable, Sequence

from dfo_contract import events

from ..ops.cache_check import cache_import_error
from ..ops.classify import Diagnosis
from . import cache_scrub

if TYPE_CHECKING:
    from .watch import Outcome


class RunCache:
    """``restore_argv``: the cache tool's command that copies the host's live cache into
    the run's (spec.cache.restore_argv; empty: the host has none to give)."""

    def __init__(self, run_dir: str, restore_argv: Sequence[str] | None,
                 emit: Callable[[events.Event], object]):
        self.dir = os.path.join(run_dir, "cache")
        self.restore_argv = list(restore_argv or ())
        self.emit = emit

    def seed(self, attempt: int) -> None:
        """The run's copy of the host's live cache, before ``attempt`` (once: a cache the
        run already has is kept)."""
        if not self.restore_argv or os.path.isdir(self.dir):
            return
        self._fill(attempt, "the run's cache seeded from the host's live cache (empty if none)",
                   "seeding failed, starting cold")

    def fault(self, out: "Outcome", diag: Diagnosis) -> str | None:
        """The line saying the attempt died at start-up loading a shared object from the
        run's cache (``ops.cache_check``), or None."""
        if out.reached_train or not os.path.isdir(self.dir):
            return None
        lines = [e.text for e in diag.evidence] + [t for _, t in getattr(out.scan, "tail", [])]
        return cache_import_error(lines, self.dir)

    def scrub(self, n: int, out: "Outcome", diag: Diagnosis) -> bool:
        """Before attempt ``n``: the run's cache without what the failed attempt left that
        cannot be loaded; cleared when the attempt died at start-up loading a shared object
        from it (:meth:`fault`). True when it was cleared. The solo run and the head call it
        in the loop, a group's member before it runs the restart the head decided."""
        if not os.path.isdir(self.dir):
            return False
        hit = self.fault(out, diag)
        if hit:
            cache_scrub.clear(self.dir)
            self.emit(events.CacheRestore(
                attempt=n, ok=True,
                detail=f"the run's cache cleared: attempt {n - 1} died at start-up loading a "
                f"shared object from it ({hit}); attempt {n} starts with a clean cache"))
            if self.restore_argv:
                self.restore(n)
            return True
        dropped = cache_scrub.scrub(self.dir)
        if dropped:
            shown = ", ".join(f"{p} ({why})" for p, why in dropped[:5])
            more = f" and {len(dropped) - 5} more" if len(dropped) > 5 else ""
            self.emit(events.CacheRestore(
                attempt=n, ok=True,
                detail=f"dropped {len(dropped)} file(s) the failed attempt left in the run's "
                f"cache that cannot be loaded: {shown}{more}"))
        return False

    def restore(self, n: int) -> None:
        """Before attempt ``n``: the run's cache kept and topped up from the host's."""
        if not self.restore_argv:
            self.emit(events.CacheRestore(
                attempt=n, ok=False,
                detail="no cache to restore from; continuing with the run's cache as it is"))
            return
        self._fill(n, "the run's cache kept (what the failed attempt built) and "
                   "topped up from the host's live cache", "restore failed")

    def _fill(self, n: int, done: str, failed: str) -> None:
        """Run the cache tool's restore command for attempt ``n``; its outcome is an event
        (``done``, or ``failed`` with the tool's last line)."""
        p = subprocess.run(self.restore_argv, capture_output=True, text=True)
        tail = (p.stderr or p.stdout).strip().splitlines()[-1:] if p.returncode else []
        self.emit(events.CacheRestore(
            attempt=n, ok=p.returncode == 0,
            detail=done if p.returncode == 0 else f"{failed}: {' '.join(tail)}"))
