"""Before a restart: drop what a failed attempt left in the run's compile cache that the
next attempt would load and fail on (``supervisor.policy.cache_check``), or clear the cache when the
attempt died at start-up loading a shared object from it."""

from __future__ import annotations

import os
import shutil

from ..remote.cache_tool import damaged


def scrub(cache_dir: str) -> list[tuple[str, str]]:
    """Delete the files of ``cache_dir`` that cannot be kept (``supervisor.policy.cache_check``); (path
    relative to it, why) for each. Nothing when the directory does not exist."""
    return [(rel, why) for rel, why in damaged(cache_dir, delete=True)]


def clear(cache_dir: str) -> None:
    """Empty the run's cache (its inductor/ and triton/ stay, empty)."""
    shutil.rmtree(cache_dir, ignore_errors=True)
    for sub in ("inductor", "triton"):
        os.makedirs(os.path.join(cache_dir, sub), exist_ok=True)
