"""The run's own compile cache (``<run-dir>/cache``), as the supervisor keeps it.

- seeded from the host's live cache once this supervisor owns the run (never by the
  launch: a launch cut off before the start leaves no copy behind);
- after a failed attempt: scrubbed of what cannot be loaded (empty files, cut-short shared
  objects), or cleared when the attempt died at start-up loading a shared object from it
  (``supervisor.policy.cache_check``);
- topped up from the host's live cache by a fallback that restores it.

What comes from the host's live cache is scrubbed as well, each time it is laid over the
run's copy: a file there that cannot be loaded, and the shared object an attempt just
failed to load, are left out of the run's copy, and the event names them (the live cache
itself is repaired with ``dfo warm-cache``; ``dfo warm-cache --status`` shows its damage).

Each step's outcome is a ``cache_restore`` event.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
from typing import TYPE_CHECKING, Callable, Sequence

from dfo_contract import events

from .policy.cache_check import cache_import_error, import_error_path
from ..common.classify import Diagnosis
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

    def size(self) -> tuple[int, int]:
        """(files, bytes) of the run's cache now ((0, 0): none); what an attempt's compile
        added shows as its growth."""
        files = total = 0
        for base, _dirs, names in os.walk(self.dir):
            for nm in names:
                try:
                    total += os.lstat(os.path.join(base, nm)).st_size
                except OSError:
                    continue
                files += 1
        return files, total

    def seed(self, attempt: int) -> None:
        """The run's copy of the host's live cache, before ``attempt`` (once: a cache the
        run already has is kept)."""
        if not self.restore_argv or os.path.isdir(self.dir):
            return
        self._fill(attempt, "the run's cache seeded from the host's live cache (empty if none)",
                   "seeding failed, starting cold")

    def fault(self, out: "Outcome", diag: Diagnosis) -> str | None:
        """The line saying the attempt died at start-up loading a shared object from the
        run's cache (``supervisor.policy.cache_check``), or None."""
        if out.reached_train or not os.path.isdir(self.dir):
            return None
        lines = [e.text for e in diag.evidence] + [t for _, t in getattr(out.scan, "tail", [])]
        return cache_import_error(lines, self.dir)

    def with_repair(self, out: "Outcome", diag: Diagnosis) -> Diagnosis:
        """``diag`` whose reason, when the attempt died loading a shared object from the
        run's cache, holds that whole line and names the repair of the host's live cache
        (the run's reason, should it end on it)."""
        hit = self.fault(out, diag)
        if not hit:
            return diag
        err = hit.split("ImportError: ", 1)[-1]
        seen = "" if err in diag.reason else f" ({hit})"
        return dataclasses.replace(diag, reason=(
            f"{diag.reason}{seen}: a shared object in the run's compile cache cannot be "
            "loaded; `dfo warm-cache --status` shows the host's live cache, `dfo warm-cache` "
            "repairs it"))

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
            then = (f"attempt {n} starts with it refilled from the host's live cache, "
                    "scrubbed" if self.restore_argv else f"attempt {n} starts with a clean cache")
            self.emit(events.CacheRestore(
                attempt=n, ok=True,
                detail=f"the run's cache cleared: attempt {n - 1} died at start-up loading a "
                f"shared object from it ({hit}); {then}"))
            if self.restore_argv:
                failed = import_error_path(hit)
                self.restore(n, failed=os.path.relpath(failed, self.dir) if failed else None)
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

    def restore(self, n: int, failed: str | None = None) -> None:
        """Before attempt ``n``: the run's cache kept and topped up from the host's
        (``failed``: the file, relative to the cache, that the last attempt failed to load:
        left out should the live cache hold it)."""
        if not self.restore_argv:
            self.emit(events.CacheRestore(
                attempt=n, ok=False,
                detail="no cache to restore from; continuing with the run's cache as it is"))
            return
        self._fill(n, "the run's cache kept (what the failed attempt built) and "
                   "topped up from the host's live cache", "restore failed", drop=failed)

    def _fill(self, n: int, done: str, failed: str, *, drop: str | None = None) -> None:
        """Run the cache tool's restore command for attempt ``n``, then scrub what it laid
        over the run's copy; its outcome is an event (``done``, with what was left out of
        the live cache's files, or ``failed`` with the tool's last line). ``drop``: a file
        (relative to the cache) the last attempt failed to load, left out if it came back."""
        p = subprocess.run(self.restore_argv, capture_output=True, text=True)
        if p.returncode:
            tail = (p.stderr or p.stdout).strip().splitlines()[-1:]
            self.emit(events.CacheRestore(attempt=n, ok=False,
                                          detail=f"{failed}: {' '.join(tail)}"))
            return
        left = cache_scrub.scrub(self.dir)
        if drop and os.path.isfile(os.path.join(self.dir, drop)):
            os.unlink(os.path.join(self.dir, drop))
            left.append((drop, f"attempt {n - 1} failed to load it"))
        if left:
            shown = ", ".join(f"{p} ({why})" for p, why in left[:5])
            more = f" and {len(left) - 5} more" if len(left) > 5 else ""
            done += (f"; the host's live cache holds {len(left)} file(s) that cannot be "
                     f"loaded, left out of the run's copy: {shown}{more}; `dfo warm-cache "
                     "--status` shows the live cache's damage, `dfo warm-cache` repairs it")
        self.emit(events.CacheRestore(attempt=n, ok=True, detail=done))
