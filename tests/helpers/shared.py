"""What one test run builds once and every test shares, also across pytest-xdist workers.

A run-shared directory (``run_dir``): the session's base temp dir, or under xdist its
parent, which every worker of the run has in common. ``built_once`` makes a directory in it
named by a content key, under a file lock: the first caller builds it (into a temporary
name, renamed when complete), every later caller, in any worker, waits for the lock and
reuses it. A key that changes (the sources were edited) gets a new directory.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path

from tests.lab.procs import file_lock

REPO = Path(__file__).resolve().parents[2]


def run_dir(tmp_path_factory) -> Path:
    """The directory every test of this run shares (all xdist workers included)."""
    base = Path(tmp_path_factory.getbasetemp())
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # <basetemp>/popen-gwN -> the run's own base temp dir
    d = base / "run-shared"
    d.mkdir(exist_ok=True)
    return d


@lru_cache(maxsize=1)
def sources_key() -> str:
    """The sha256 of the project's sources (what dfo's wheel cache is keyed by)."""
    from orchestrator.engine.wheel import source_digest

    return source_digest(REPO)


def built_once(shared: Path, name: str, key: str, build: Callable[[Path], None]) -> Path:
    """``shared/<name>-<key16>``, made by ``build(tmp_dir)`` by the first caller of the run."""
    dest = shared / f"{name}-{key[:16]}"
    with file_lock(shared / f".{dest.name}.lock"):
        if not dest.is_dir():
            tmp = shared / f".{dest.name}.partial"
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
            build(tmp)
            os.rename(tmp, dest)
    return dest


def locked(shared: Path, name: str):
    """The run-wide lock ``name`` (a file lock in the run-shared dir)."""
    return file_lock(shared / f".{name}.lock")
