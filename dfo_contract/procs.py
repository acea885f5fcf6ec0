"""Process helpers shared by every part (Linux /proc): one reader of ``/proc/PID/stat``, and
the one rule for "is this still that process".

A pid alone does not name a process: once it exits, the kernel may give its number to
another one. So a record that must find its process again later keeps a second fact
about it, and a check compares both:

- its start time (:func:`process_start`, clock ticks after boot, never changes for the
  life of a process): :func:`same_process`;
- or words of its command line (``-m orchestrator.supervisor`` and its run directory):
  :func:`runs_with`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Sequence


def pid_alive(pid: int) -> bool:
    """True when a process with this pid exists (ours or another user's; a zombie too).

    ``pid <= 0`` is never alive: ``os.kill(0 or -1, 0)`` would ask about a whole
    process group, not one process.
    """
    if pid <= 0:
        return False
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass(frozen=True)
class ProcStat:
    """The fields of ``/proc/PID/stat`` that dfo reads (times in clock ticks)."""

    state: str        # R, S, D, Z, ...
    ppid: int
    utime: int        # user CPU of the process itself
    stime: int        # system CPU of the process itself
    cutime: int       # user CPU of its reaped children
    cstime: int       # system CPU of its reaped children
    start: int        # start time, ticks after boot

    @property
    def zombie(self) -> bool:
        return self.state == "Z"

    @property
    def stopped(self) -> bool:
        """Stopped by a signal (T: SIGSTOP, SIGTSTP, SIGTTIN/OU) or by a tracer (t): it runs
        no code at all until someone continues it."""
        return self.state in ("T", "t")

    @property
    def cpu_ticks(self) -> int:
        """CPU of the process and its reaped children."""
        return self.utime + self.stime + self.cutime + self.cstime


def parse_stat(data: bytes | str) -> ProcStat | None:
    """One ``/proc/PID/stat`` line (None when it is not one). The command name in
    parentheses may hold spaces and ``)``, so the fields are counted after the last ``)``."""
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    try:
        f = text[text.rindex(")") + 2:].split()
        return ProcStat(state=f[0], ppid=int(f[1]), utime=int(f[11]), stime=int(f[12]),
                        cutime=int(f[13]), cstime=int(f[14]), start=int(f[19]))
    except (ValueError, IndexError):
        return None


def proc_stat(pid: int | str, *, task: int | str | None = None) -> ProcStat | None:
    """``/proc/PID/stat`` (or a thread's, ``/proc/PID/task/TID/stat``) read and parsed;
    None when the process is gone or the file is unreadable. ``pid`` may be ``"self"``."""
    path = f"/proc/{pid}/stat" if task is None else f"/proc/{pid}/task/{task}/stat"
    try:
        with open(path, "rb") as f:
            return parse_stat(f.read())
    except OSError:
        return None


def process_start(pid: int | str) -> int | None:
    """The process's start time in clock ticks after boot (None when it is gone)."""
    st = proc_stat(pid)
    return None if st is None else st.start


def alive(pid: int) -> bool:
    """The process exists and is not a zombie (an exited child nobody has reaped yet)."""
    if not pid_alive(pid):
        return False
    st = proc_stat(pid)
    return st is not None and not st.zombie


def cmdline(pid: int) -> list[str]:
    """The process's argv ([] when it is gone, a zombie or a kernel thread)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode("utf-8", "replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def same_process(pid: object, start: object) -> bool:
    """Whether ``pid`` is still the live process that had start time ``start``
    (:func:`process_start`, recorded with the pid); False after pid reuse."""
    if not isinstance(pid, int) or isinstance(pid, bool) or not isinstance(start, int) \
            or isinstance(start, bool):
        return False
    st = proc_stat(pid)
    return st is not None and not st.zombie and st.start == start


def runs_with(pid: object, words: Sequence[str]) -> bool:
    """Whether ``pid`` is a live process whose argv holds every one of ``words`` as a whole
    argument (a reused pid runs something else, so it is not taken for the recorded one)."""
    if not isinstance(pid, int) or isinstance(pid, bool) or not alive(pid):
        return False
    argv = cmdline(pid)
    return all(w in argv for w in words)


#: the module the supervisor runs as (``python -m orchestrator.supervisor --run-dir DIR``)
SUPERVISOR_MODULE = "orchestrator.supervisor"


def supervisor_alive(run_dir: str, pid: object) -> bool:
    """Whether the supervisor of ``run_dir`` (state.json's ``pid``) is still running: that
    pid is live and is ``-m orchestrator.supervisor`` for this run directory."""
    return runs_with(pid, (SUPERVISOR_MODULE, run_dir))
