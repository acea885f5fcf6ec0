"""run.lock as the supervisor takes it (``supervisor.record.RunLock``), against real flocks
held by another process: a lock busy for a moment (the launch probe's
``flock -n run.lock true``, deploy's switch) is waited out; one a live run holds is reported
with its owner, and the supervisor's fd is not inherited by its children."""

from __future__ import annotations

import subprocess
import threading

from orchestrator.supervisor.record import RunLock


def _holder(path) -> subprocess.Popen:
    """Another process holding ``path`` (flock) until its stdin closes; returns once held."""
    p = subprocess.Popen(["flock", str(path), "-c", "echo held; read x"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    return p


def test_a_lock_busy_for_a_moment_is_taken_once_free(tmp_path):
    path = tmp_path / "locks" / "run.lock"
    path.parent.mkdir()
    path.write_text("old-run\n")
    holder = _holder(path)
    lock = RunLock(str(path), "new-run", grace_s=120)
    got: list = []
    th = threading.Thread(target=lambda: got.append(lock.take()))
    th.start()
    try:
        assert th.is_alive() and not got      # still waiting while the other holds it
    finally:
        holder.stdin.close()                  # the moment is over
        holder.wait(timeout=60)
    th.join(timeout=120)
    assert got == [None] and lock.fd is not None
    assert path.read_text() == "new-run\n"
    lock.release()
    assert lock.fd is None


def test_a_lock_a_live_run_holds_names_that_run(tmp_path):
    path = tmp_path / "run.lock"
    path.write_text("live-run\n")
    holder = _holder(path)
    try:
        lock = RunLock(str(path), "new-run", grace_s=0.2)
        assert lock.take() == "live-run"
        assert lock.fd is None and path.read_text() == "live-run\n"
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)


def test_children_do_not_hold_the_lock_after_release(tmp_path):
    path = tmp_path / "run.lock"
    lock = RunLock(str(path), "r1", grace_s=0)
    assert lock.take() is None
    child = subprocess.Popen(["sh", "-c", "read x"], stdin=subprocess.PIPE, close_fds=False)
    try:
        lock.release()
        # the child still runs, yet the lock is free at once
        r = subprocess.run(["flock", "-n", str(path), "true"])
        assert child.poll() is None and r.returncode == 0
    finally:
        child.stdin.close()
        child.wait(timeout=60)
