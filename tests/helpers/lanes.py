"""Lanes of one test run under pytest-xdist (docs/testing.md, "Built once per run, and the
two lanes"); ``scripts/test.sh`` runs ``-n 2 --dist loadgroup``.

- Every test marked ``lab`` goes to the lane ``lab``: they share container 200's fixed
  roots, the lab's wheelhouse and its exclusive containers, so one worker runs them one
  after another, in file order.
- Every other test goes with its file: a file runs on one worker, in file order, so its
  module-scoped fixtures are made once (as without xdist).
- Work units start longest expected first: the lab lane, then files with a ``slow`` test,
  then the rest, so that a long file does not start last and leave one worker idle.
- A test of SOLO_FILES (it judges throughput or timing on this machine's cores) is marked
  ``solo`` and runs with no other test of the run beside it: it takes the run's lane lock
  exclusively, every other test takes it shared. A turnstile lock gives the exclusive taker
  its turn: once a solo test waits, no new test starts until it has run.

The lanes are made by our own scheduler (``pytest_xdist_make_scheduler``): xdist's
``loadgroup`` reads ``xdist_group`` marks through node ids that pytest 9.2 does not let a
plugin change, so it would silently spread a group over both workers. The workers see the
marks; the controller only sees node ids: each worker writes ``{node id: lane}`` for its
``lab`` tests into a directory the controller made (``$DFO_TEST_LANES_DIR``), and the
scheduler reads it when it splits the collection into work units.

Without xdist (one process) nothing here runs but the lane lock, which is then never
contended and costs two flock calls a test.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import tempfile
from pathlib import Path

LAB_LANE = "lab"
# files whose tests judge throughput or timing on this machine's cores (a CPU hog beside a
# run, a hang timed against heartbeats): every test in them runs ``solo``
SOLO_FILES = ("test_supervisor_drills",)
ENV = "DFO_TEST_LANES_DIR"


def _distributing(config) -> bool:
    """The controller of an xdist run with ``--dist loadgroup``."""
    return (not hasattr(config, "workerinput") and getattr(config.option, "numprocesses", None)
            and getattr(config.option, "dist", "no") == "loadgroup")


def configure(config) -> None:
    """Controller: the directory the workers write their lanes into; work units are handed
    out in the order ``assign`` gave the collection (not by their number of tests)."""
    if _distributing(config):
        d = tempfile.mkdtemp(prefix="dfo-test-lanes-")
        os.environ[ENV] = d
        config.stash[_DIR] = d
        config.option.loadscopereorder = False


def unconfigure(config) -> None:
    d = config.stash.get(_DIR, None)
    if d:
        shutil.rmtree(d, ignore_errors=True)
        os.environ.pop(ENV, None)


def _rank(items) -> dict:
    """The order work units start in, longest expected first: the lab lane, then the files
    with a ``slow`` test, then the rest (each in collection order)."""
    rank: dict = {}
    for item in items:
        r = 0 if item.get_closest_marker("lab") else 1 if item.get_closest_marker("slow") else 2
        key = LAB_LANE if r == 0 else item.path
        rank[key] = min(rank.get(key, r), r)
    return rank


def assign(config, items) -> None:
    """Worker: mark the tests of SOLO_FILES ``solo``; order the collection (``_rank``; a
    file's tests, and the lab tests, keep their order); write the ``lab`` tests' lane."""
    import pytest

    if not hasattr(config, "workerinput"):
        return
    rank = _rank(items)
    first: dict = {}
    for i, item in enumerate(items):
        first.setdefault(item.path, i)
    items[:] = sorted(items, key=lambda it: (
        0 if it.get_closest_marker("lab") else rank[it.path], first[it.path]))
    lanes = {}
    for item in items:
        if item.path.stem in SOLO_FILES:
            item.add_marker(pytest.mark.solo)
        if item.get_closest_marker("lab"):
            lanes[item.nodeid] = LAB_LANE
    d = os.environ.get(ENV)
    if d:
        p = Path(d) / f"{config.workerinput['workerid']}.json"
        tmp = p.with_suffix(".tmp")
        tmp.write_text(json.dumps(lanes))
        os.replace(tmp, p)


def make_scheduler(config, log):
    """Controller: a scheduler whose work units are the ``lab`` lane and the other files."""
    if not _distributing(config):
        return None
    from xdist.scheduler import LoadScopeScheduling

    class LaneScheduling(LoadScopeScheduling):
        _lanes: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self._lanes is None:
                self._lanes = {}
                for p in sorted(Path(config.stash[_DIR]).glob("*.json")):
                    self._lanes.update(json.loads(p.read_text()))
            return self._lanes.get(nodeid) or nodeid.split("::", 1)[0]

    return LaneScheduling(config, log)


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


def _stash_key():
    import pytest

    return pytest.StashKey[str]()


_DIR = _stash_key()
