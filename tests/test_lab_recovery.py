"""Lab self-tests: leftovers of a killed run never break the next ``up``, and a
stale PID file never makes the lab kill a stranger. Each test uses its own
sshd state dir (never the shared lab's)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from tests.lab import Container, Lab, Sshd
from tests.lab.procs import pid_alive

pytestmark = pytest.mark.lab

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def root_only():
    if os.geteuid() != 0:
        pytest.skip("needs root")


def _ssh_ok(info) -> bool:
    p = subprocess.run(info.ssh_argv("true"), capture_output=True, timeout=30, stdin=subprocess.DEVNULL)
    return p.returncode == 0


def test_stale_pid_file_never_kills_a_stranger(root_only, tmp_path):
    stranger = subprocess.Popen(["sleep", "300"])
    try:
        s = Sshd(tmp_path / "sshd")
        s.dir.mkdir()
        s.pid_file.write_text(f"{stranger.pid}\n")
        assert s.pid() is None  # the PID is alive but is not our sshd
        info, started = s.up()
        assert started and info.pid != stranger.pid and _ssh_ok(info)
        assert s.down()
        assert pid_alive(stranger.pid)
        assert not pid_alive(info.pid)
    finally:
        stranger.kill()
        stranger.wait()


def test_up_recovers_from_a_killed_sshd_and_a_taken_port(root_only, tmp_path):
    s = Sshd(tmp_path / "sshd")
    info, _ = s.up()
    os.kill(info.pid, signal.SIGKILL)
    deadline = time.monotonic() + 60      # only ends a broken run: the kernel tears it down
    while pid_alive(info.pid):
        assert time.monotonic() < deadline, "the killed sshd is still alive"
        time.sleep(0.02)
    # someone else grabs the old port meanwhile (once a connection child of the killed sshd,
    # which holds the listening socket until it exits, is gone too)
    squatter = socket.socket()
    squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    while True:
        try:
            squatter.bind(("127.0.0.1", info.port))
            break
        except OSError:
            assert time.monotonic() < deadline, f"port {info.port} still held after the kill"
            time.sleep(0.02)
    squatter.listen()
    try:
        info2, started = s.up()
        assert started and info2.port != info.port and _ssh_ok(info2)
        assert open(info2.known_hosts).read().startswith(f"[127.0.0.1]:{info2.port} ")
        # a second up finds it running and keeps it
        info3, started = s.up()
        assert not started and info3.pid == info2.pid
    finally:
        squatter.close()
        s.down()


def test_a_killed_session_does_not_keep_the_lab_alive(root_only, tmp_path):
    """A session that dies without teardown leaves sshd up and a dead lease;
    the next session prunes the lease, reuses the sshd and, being the last one
    out, stops it."""
    state = tmp_path / "lab"
    child = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {REPO!r})
        from tests.lab import Lab
        Lab({str(state)!r}).up(container=False)
        os.kill(os.getpid(), 9)
    """)
    p = subprocess.run([sys.executable, "-c", child], capture_output=True, timeout=60)
    assert p.returncode == -9, p.stderr
    lab = Lab(state)
    st = lab.status()
    assert st["sshd"]["running"] and st["leases"] == []  # the dead lease was pruned
    leftover = st["sshd"]["pid"]
    info = lab.up(container=False)
    assert lab.sshd.pid() == leftover and _ssh_ok(info)  # reused, not duplicated
    assert lab.release() is True
    assert not pid_alive(leftover)
    assert lab.status()["containers"] == {}  # a state dir without containers stops none


def test_manual_lease_outlives_sessions(root_only, tmp_path):
    lab = Lab(tmp_path / "lab")
    lab.up(container=False, lease="manual")
    try:
        lab.up(container=False)
        assert lab.release() is False  # "manual" still holds it
        assert lab.sshd.pid()
    finally:
        lab.down()
    assert lab.sshd.pid() is None and lab.status()["leases"] == []


def test_half_built_container_is_not_taken_for_built(root_only):
    ct = Container(298)
    if ct.exists():
        ct.destroy()
    ct.dir.mkdir(parents=True)
    try:
        ct.config.write_text("lxc.uts.name = dfo-lab-298\n")  # as if lxc-create was killed
        assert ct.exists() and not ct.built()
        ct.destroy()
        assert not ct.dir.exists()
    finally:
        if ct.dir.exists():
            import shutil
            shutil.rmtree(ct.dir)
