"""Before a restart: drop what a failed attempt left in the run's compile cache that the
next attempt would load and fail on (``ops.cache_check``), or clear the cache when the
attempt died at start-up loading a shared object from it."""

from __future__ import annotations

import os
import shutil

from ..ops.cache_check import bad_artifact


def scrub(cache_dir: str) -> list[tuple[str, str]]:
    """Delete the files of ``cache_dir`` that cannot be kept; (path relative to it, why)
    for each. Nothing when the directory does not exist."""
    dropped: list[tuple[str, str]] = []
    for base, _dirs, files in os.walk(cache_dir):
        for f in files:
            p = os.path.join(base, f)
            try:
                st = os.lstat(p)
                if not os.path.isfile(p) or os.path.islink(p):
                    continue
                with open(p, "rb") as fh:
                    head = fh.read(4)
            except OSError:
                continue
            why = bad_artifact(f, st.st_size, head)
            if why:
                try:
                    os.unlink(p)
                except OSError:
                    continue
                dropped.append((os.path.relpath(p, cache_dir), why))
    return dropped


def clear(cache_dir: str) -> None:
    """Empty the run's cache (its inductor/ and triton/ stay, empty)."""
    shutil.rmtree(cache_dir, ignore_errors=True)
    for sub in ("inductor", "triton"):
        os.makedirs(os.path.join(cache_dir, sub), exist_ok=True)
