"""What the supervisor samples about its attempt and the host (Linux /proc, nvidia-smi).

- :class:`TreeMeter`: CPU seconds and I/O bytes of the attempt's whole process tree,
  cumulative and never decreasing (a child that exits or is re-parented takes nothing
  back): the watchdog's evidence that a silent attempt is working (compiling) or stuck.
- :func:`host_sample`: /proc/stat and /proc/loadavg, for ``supervisor.policy.host_load.judge``.
- :func:`gpu_apps`: ``nvidia-smi --query-compute-apps`` (None when there is no nvidia-smi
  or it fails: unknown, not an error).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from typing import Iterable

from dfo_contract.procs import proc_stat

from ..common.gpu_apps import APPS_QUERY, GpuApp, parse_apps_csv
from .policy.host_load import HostSample, parse_loadavg, parse_proc_stat

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _read(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8", "replace")
    except OSError:
        return None


def proc_cpu_s(pid: int) -> float | None:
    """utime+stime+cutime+cstime of one process, in seconds (None when it is gone)."""
    st = proc_stat(pid)
    return None if st is None else st.cpu_ticks / _TICK


def proc_io_bytes(pid: int) -> int:
    """rchar+wchar of one process (0 when unreadable)."""
    text = _read(f"/proc/{pid}/io")
    if not text:
        return 0
    n = 0
    for ln in text.splitlines():
        k, _, v = ln.partition(":")
        if k in ("rchar", "wchar"):
            try:
                n += int(v)
            except ValueError:
                pass
    return n


class TreeMeter:
    """Cumulative CPU seconds and I/O bytes of a changing set of processes: each sample adds
    what every process used since it was last seen (a new process counts in full)."""

    def __init__(self) -> None:
        self.cpu_s = 0.0
        self.io_bytes = 0
        self._last: dict[int, tuple[float, int]] = {}

    def sample(self, pids: Iterable[int]) -> tuple[float, int]:
        now: dict[int, tuple[float, int]] = {}
        for p in pids:
            c = proc_cpu_s(p)
            if c is None:
                continue
            now[p] = (c, proc_io_bytes(p))
            pc, pio = self._last.get(p, (0.0, 0))
            self.cpu_s += max(0.0, c - pc)
            self.io_bytes += max(0, now[p][1] - pio)
        self._last = now
        return self.cpu_s, self.io_bytes


def host_sample(t: float, tree_cpu_s: float) -> HostSample:
    cpu, ncpu = parse_proc_stat(_read("/proc/stat") or "")
    return HostSample(t=t, cpu=cpu, ncpu=ncpu or (os.cpu_count() or 1),
                      load1=parse_loadavg(_read("/proc/loadavg") or ""), tree_cpu_s=tree_cpu_s)


def gpu_apps(timeout: float = 10.0) -> list[GpuApp] | None:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        p = subprocess.run([exe, *APPS_QUERY], capture_output=True, text=True,
                           timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if p.returncode != 0:
        return None
    return parse_apps_csv(p.stdout)


def local_addr(head_addr: str, port: int) -> str | None:
    """This node's own address on the way to the head: the source address the kernel picks
    for a UDP socket "connected" to it (nothing is sent). torchrun's ``--local-addr``; None
    when there is no route (torchrun then falls back to the hostname)."""
    try:
        fam = socket.AF_INET6 if ":" in head_addr else socket.AF_INET
        with socket.socket(fam, socket.SOCK_DGRAM) as s:
            s.connect((head_addr, port))
            return str(s.getsockname()[0])
    except OSError:
        return None
