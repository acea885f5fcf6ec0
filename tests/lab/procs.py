"""Small process/file helpers for the lab: PIDs checked against their command
line (a stale PID file never makes us kill a stranger), a file lock, free ports. Atomic
writes are dfo_contract.fsio's."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import random
import signal
import socket
import time
from pathlib import Path

from dfo_contract.procs import pid_alive as _pid_exists


def pid_cmdline(pid: int) -> list[str] | None:
    """The argv of a live process, or None when there is no such process."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    if not raw:  # zombie or kernel thread
        return None
    return [a.decode("utf-8", "replace") for a in raw.rstrip(b"\0").split(b"\0")]


def pid_alive(pid: int) -> bool:
    """Alive and not a zombie (a zombie has an empty cmdline)."""
    return _pid_exists(pid) and pid_cmdline(pid) is not None


def read_pid(path: Path) -> int | None:
    try:
        text = Path(path).read_text().strip()
    except FileNotFoundError:
        return None
    return int(text) if text.isdigit() else None


def pid_matches(pid: int | None, needle: str) -> bool:
    """True when ``pid`` is alive and its command line contains ``needle`` (e.g.
    our private sshd_config path; sshd rewrites its argv into one title string)."""
    if not pid:
        return False
    argv = pid_cmdline(pid)
    return bool(argv) and needle in " ".join(argv)


def kill_pid(pid: int, *, timeout: float = 5.0) -> None:
    """SIGTERM, wait, then SIGKILL one process (by PID, never by name)."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        # reap it if it is our child, so it does not linger as a zombie
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        if not pid_alive(pid):
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def free_port(preferred: int | None = None) -> int:
    """A TCP port free on 127.0.0.1 (``preferred`` when it is free)."""
    if preferred:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", preferred))
                return preferred
            except OSError as e:
                if e.errno != errno.EADDRINUSE:
                    raise
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_port_pair() -> int:
    """A port P with P and P + 1 both free on 127.0.0.1 (a group's coordination port and the
    one after it), below the kernel's ephemeral range: no outgoing connection of another
    test is given P + 1 between this check and the group's bind."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        low = int(f.read().split()[0])
    pick = random.Random()
    for _ in range(500):
        p = pick.randrange(10000, max(10002, low - 2))
        if all(_bindable(q) for q in (p, p + 1)):
            return p
    raise RuntimeError(f"no two free consecutive ports in 10000..{low}")


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def wait_banner(port: int, timeout: float = 10.0) -> bool:
    """Wait until something on 127.0.0.1:port answers with an SSH banner."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1.0) as s:
                if s.recv(64).startswith(b"SSH-"):
                    return True
        except OSError:
            pass
        time.sleep(0.05)
    return False


@contextlib.contextmanager
def file_lock(path: Path):
    """An exclusive flock, so two test sessions never bring the lab up at once."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
