"""The suite's own sharing mechanisms (tests/helpers/shared.py, tests/helpers/lanes.py), with
real processes and real flocks: a content-keyed build made once for concurrent callers, and
the lane lock that lets a ``solo`` test run with nothing beside it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from tests.helpers.shared import REPO, built_once

# one process: takes the lane (or a build) and records when it is in, then waits for its
# release file before it lets go
LANE = r"""
import sys, time
from pathlib import Path
from tests.helpers.lanes import lane
d, name, solo = Path(sys.argv[1]), sys.argv[2], sys.argv[3] == "1"
with lane(d, solo=solo):
    (d / f"{name}-in").touch()
    while not (d / f"{name}-release").exists():
        time.sleep(0.02)
"""

BUILD = r"""
import sys, time
from pathlib import Path
from tests.helpers.shared import built_once
d = Path(sys.argv[1])
def build(tmp):
    with open(d / "builds", "a") as f:
        f.write("1")
    (d / "started").touch()
    while not (d / "go").exists():
        time.sleep(0.02)
    (tmp / "made").write_text("x")
print(built_once(d, "thing", "ab" * 32, build))
"""


def _spawn(code: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code, *args], cwd=REPO, text=True,
                            stdout=subprocess.PIPE, env=dict(os.environ, PYTHONPATH=str(REPO)))


def _wait(pred, what: str, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def _blocked_in_flock(pid: int) -> bool:
    """/proc/locks lists a request that waits for a lock as ``N: -> FLOCK ADVISORY WRITE PID ...``."""
    for ln in Path("/proc/locks").read_text().splitlines():
        f = ln.split()
        if "->" in f and f[f.index("->") + 1:f.index("->") + 2] == ["FLOCK"]:
            if f[f.index("->") + 4:f.index("->") + 5] == [str(pid)]:
                return True
    return False


def test_built_once_builds_for_the_first_caller_and_the_second_reuses_it(tmp_path):
    a = _spawn(BUILD, str(tmp_path))
    _wait(lambda: (tmp_path / "started").exists(), "the first build to start")
    b = _spawn(BUILD, str(tmp_path))
    _wait(lambda: _blocked_in_flock(b.pid), "the second caller to wait for the lock")
    (tmp_path / "go").touch()
    outs = [p.communicate(timeout=60)[0].strip() for p in (a, b)]
    assert a.returncode == b.returncode == 0
    dest = tmp_path / f"thing-{'ab' * 8}"
    assert outs == [str(dest), str(dest)] and (dest / "made").read_text() == "x"
    assert (tmp_path / "builds").read_text() == "1"          # built once
    assert not list(tmp_path.glob("*.partial"))
    assert built_once(tmp_path, "thing", "ab" * 32, lambda d: 1 / 0) == dest  # no rebuild


def test_a_solo_test_waits_for_the_running_one_and_no_new_one_starts_meanwhile(tmp_path):
    procs = []
    try:
        p1 = _spawn(LANE, str(tmp_path), "p1", "0")           # a test running
        procs.append(p1)
        _wait(lambda: (tmp_path / "p1-in").exists(), "p1 in its lane")
        p2 = _spawn(LANE, str(tmp_path), "p2", "1")           # a solo test: waits for p1
        procs.append(p2)
        _wait(lambda: _blocked_in_flock(p2.pid), "the solo test to wait")
        p3 = _spawn(LANE, str(tmp_path), "p3", "0")           # the next test: waits for p2
        procs.append(p3)
        _wait(lambda: (tmp_path / "p3-in").exists() or _blocked_in_flock(p3.pid),
              "the next test to start or wait")
        assert not (tmp_path / "p3-in").exists()               # no new test while solo waits
        assert not (tmp_path / "p2-in").exists()               # solo waits for the running one
        (tmp_path / "p1-release").touch()
        _wait(lambda: (tmp_path / "p2-in").exists(), "the solo test to run")
        assert not (tmp_path / "p3-in").exists()               # nothing beside the solo test
        (tmp_path / "p2-release").touch()
        _wait(lambda: (tmp_path / "p3-in").exists(), "the next test after the solo one")
        (tmp_path / "p3-release").touch()
        assert [p.wait(timeout=60) for p in procs] == [0, 0, 0]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
