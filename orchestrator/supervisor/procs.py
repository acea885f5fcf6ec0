"""Process plumbing for the supervisor (Linux /proc): the trainer's process tree, killing it,
finding orphans of a run, dumping stacks, and the parent-death signal."""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
import signal
import subprocess
import time
from typing import Iterable

from dfo_contract.procs import alive, cmdline, proc_stat  # noqa: F401 - procs.cmdline: its callers

from .policy import oom

PR_SET_PDEATHSIG = 1


def set_pdeathsig(sig: int = signal.SIGKILL) -> None:
    """preexec_fn: the child gets ``sig`` when the supervisor (its parent) dies."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    if os.getppid() == 1:  # parent already gone between fork and prctl
        os.kill(os.getpid(), int(sig))


def _ppid_map() -> dict[int, int]:
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        st = proc_stat(name)
        if st is not None:
            out[int(name)] = st.ppid
    return out


def descendants(pid: int) -> list[int]:
    """pid and every live descendant (children first found, breadth-first)."""
    pmap = _ppid_map()
    kids: dict[int, list[int]] = {}
    for p, pp in pmap.items():
        kids.setdefault(pp, []).append(p)
    out, todo = [], [pid]
    while todo:
        p = todo.pop(0)
        if p in pmap or p == pid:
            out.append(p)
        todo.extend(kids.get(p, []))
    return [p for p in out if p in pmap]


def stopped(pids: Iterable[int]) -> tuple[int, ...]:
    """Those of ``pids`` that are stopped (state T or t: a signal or a tracer stopped them)."""
    out = []
    for p in pids:
        st = proc_stat(p)
        if st is not None and st.stopped:
            out.append(p)
    return tuple(out)


def env_of(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return {}
    out = {}
    for item in raw.split(b"\0"):
        if b"=" in item:
            k, v = item.split(b"=", 1)
            out[k.decode("utf-8", "replace")] = v.decode("utf-8", "replace")
    return out


def processes_of_run(run_dir: str, *, exclude: Iterable[int] = ()) -> list[int]:
    """Live processes whose environment says they belong to this run (DFO_RUN_DIR):
    the trainer, torchrun and its workers, whatever session they moved to."""
    ex = set(exclude) | {os.getpid()}
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in ex:
            continue
        if env_of(int(name)).get("DFO_RUN_DIR") == run_dir and alive(int(name)):
            out.append(int(name))
    return sorted(out)


def signal_all(pids: Iterable[int], sig: int) -> None:
    for p in pids:
        try:
            os.kill(p, sig)
        except (ProcessLookupError, PermissionError):
            pass


def kill_tree(root_pid: int, run_dir: str, *, sig: int = signal.SIGKILL,
              exclude: Iterable[int] = ()) -> list[int]:
    """Signal the trainer's tree and every process of the run but ``exclude`` (the
    standby interpreter); return the pids signalled."""
    pids = sorted(set(descendants(root_pid)) | set(processes_of_run(run_dir, exclude=exclude)))
    signal_all(pids, sig)
    return pids


def catches(pid: int, sig: int) -> bool:
    """Whether ``pid`` has a handler for ``sig`` (SigCgt in /proc/PID/status)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for ln in f:
                if ln.startswith("SigCgt:"):
                    return bool(int(ln.split()[1], 16) & (1 << (int(sig) - 1)))
    except (OSError, ValueError):
        pass
    return False


def py_spy(extra_dirs: Iterable[str] = ()) -> str | None:
    for d in extra_dirs:
        p = os.path.join(d, "py-spy")
        if os.access(p, os.X_OK):
            return p
    return shutil.which("py-spy")


def kernel_stacks(pid: int) -> str:
    """Per-thread name, state and wait channel (works for any process, no cooperation)."""
    lines = []
    try:
        tids = sorted(os.listdir(f"/proc/{pid}/task"), key=int)
    except OSError:
        return ""
    for tid in tids:
        base = f"/proc/{pid}/task/{tid}"
        try:
            comm = open(f"{base}/comm").read().strip()
            wchan = open(f"{base}/wchan").read().strip() or "-"
        except OSError:
            continue
        st = proc_stat(pid, task=tid)
        if st is None:
            continue
        lines.append(f"thread {tid} {comm!r} state={st.state} wchan={wchan}")
    return "\n".join(lines) + "\n"


def py_spy_dump(exe: str, pid: int, timeout: float = 20.0) -> str | None:
    try:
        p = subprocess.run([exe, "dump", "--pid", str(pid)], capture_output=True, text=True,
                           timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (p.stdout + p.stderr) if (p.stdout or p.stderr) else None


def _cgroups(path: str = "/proc/self/cgroup") -> tuple[str | None, str | None]:
    """(the cgroup v2 path, the v1 memory controller's path) of this process."""
    v2 = v1 = None
    try:
        with open(path) as f:
            for ln in f:
                parts = ln.rstrip("\n").split(":", 2)
                if len(parts) != 3:
                    continue
                if parts[0] == "0" and parts[1] == "":
                    v2 = parts[2]
                elif "memory" in parts[1].split(","):
                    v1 = parts[2]
    except OSError:
        pass
    return v2, v1


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def oom_counters(fs: str = "/sys/fs/cgroup") -> oom.OomCounters:
    """This process's cgroup OOM counters: v2 ``memory.events`` and v1 ``memory.oom_control``
    and ``memory.failcnt`` (where the v1 memory controller is mounted)."""
    v2, v1 = _cgroups()
    v2_kill = None
    if v2 is not None:
        for d in (f"{fs}{v2}", fs):
            text = _read(f"{d.rstrip('/')}/memory.events")
            if text is not None:
                v2_kill = oom.parse_memory_events(text)
                break
    under = kill = failcnt = None
    if v1 is not None:
        for d in (f"{fs}/memory{v1}", f"{fs}/memory"):
            text = _read(f"{d.rstrip('/')}/memory.oom_control")
            if text is not None:
                under, kill = oom.parse_oom_control(text)
                fc = _read(f"{d.rstrip('/')}/memory.failcnt")
                failcnt = int(fc) if fc and fc.strip().isdigit() else None
                break
    return oom.OomCounters(v2_kill, kill, under, failcnt)


class KernelLog:
    """The kernel's log records written since :meth:`open` (``/dev/kmsg``, read without
    blocking); empty where it cannot be read (no permission, no device)."""

    def __init__(self, path: str = "/dev/kmsg"):
        self.fd: int | None = None
        try:
            self.fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            os.lseek(self.fd, 0, os.SEEK_END)
        except OSError:
            self.close()

    def read(self, limit: int = 100000) -> list[str]:
        out: list[str] = []
        while self.fd is not None and len(out) < limit:
            try:
                rec = os.read(self.fd, 8192)
            except BlockingIOError:
                break
            except OSError as e:
                if e.errno == errno.EPIPE:   # records overwritten under us: go on
                    continue
                break
            if not rec:
                break
            out.append(rec.decode("utf-8", "replace"))
        return out

    def close(self) -> None:
        if self.fd is not None:
            try:
                os.close(self.fd)
            except OSError:
                pass
        self.fd = None


def wait_gone(pids: Iterable[int], timeout: float, poll: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    pids = list(pids)
    while time.monotonic() < deadline:
        if not any(alive(p) for p in pids):
            return True
        time.sleep(poll)
    return not any(alive(p) for p in pids)
