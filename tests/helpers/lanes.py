"""Lanes of one test run under pytest-xdist (docs/testing.md, "Speed and lanes").

- Every test marked ``lab`` joins the xdist group ``lab``: they share container 200's
  fixed roots, the lab's wheelhouse and its exclusive containers, so ``--dist loadgroup``
  runs them one after another on one worker, in file order.
- Every other test joins the group of its file: a file runs on one worker, in file order,
  so its module-scoped fixtures are made once (as without xdist).
- A test marked ``solo`` (it judges throughput or timing on this machine's cores) runs with
  no other test of the run beside it: it takes the run's lane lock exclusively, every other
  test takes it shared. A turnstile lock gives the exclusive taker its turn: once a solo
  test waits, no new test starts until it has run.

Without xdist (one process) the lock is never contended and costs two flock calls a test.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

LAB_GROUP = "lab"
# files whose tests judge throughput or timing on this machine's cores (a CPU hog beside a
# run, a hang timed against heartbeats): every test in them runs ``solo``
SOLO_FILES = ("test_supervisor_drills",)


def assign_groups(items) -> None:
    """The xdist group of every test without one of its own (``lab``, or its file), and the
    ``solo`` mark on the tests of SOLO_FILES."""
    import pytest

    for item in items:
        if item.path.stem in SOLO_FILES:
            item.add_marker(pytest.mark.solo)
        if item.get_closest_marker("xdist_group"):
            continue
        name = LAB_GROUP if item.get_closest_marker("lab") else item.path.stem
        item.add_marker(pytest.mark.xdist_group(name))


@contextlib.contextmanager
def _flock(path: Path, how: int):
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, how)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


@contextlib.contextmanager
def lane(shared: Path, *, solo: bool):
    """Hold the run's lane lock for one test: exclusively when ``solo``, else shared."""
    turnstile, rw = shared / ".lane-turnstile.lock", shared / ".lane.lock"
    if solo:
        with _flock(turnstile, fcntl.LOCK_EX), _flock(rw, fcntl.LOCK_EX):
            yield
        return
    with _flock(turnstile, fcntl.LOCK_EX):
        pass  # waits while a solo test waits for its turn or runs
    with _flock(rw, fcntl.LOCK_SH):
        yield
