"""Evidence that the kernel's OOM killer ended an attempt. Pure: the supervisor reads the
files and the kernel log (``supervisor.procs``), these functions read their text.

- cgroup v2: ``memory.events``' ``oom_kill`` counter;
- cgroup v1 (many Proxmox LXC hosts): ``memory.oom_control``'s ``oom_kill`` (kernels >= 4.13)
  and ``under_oom``, and ``memory.failcnt`` (hits of the limit, which alone kill nothing);
- the kernel's own record (``/dev/kmsg``, as ``dmesg`` prints it): ``Out of memory: Killed
  process PID (NAME)``, ``Memory cgroup out of memory: Killed process PID (NAME)`` and
  ``oom-kill:...,pid=PID,...``; these name the killed process, so they count only when the
  pid is one of the attempt's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable

VERSION = 1


def parse_memory_events(text: str) -> int | None:
    """cgroup v2 ``memory.events``: its ``oom_kill`` count, or None when absent."""
    return _field(text, "oom_kill")


def parse_oom_control(text: str) -> tuple[int | None, int | None]:
    """cgroup v1 ``memory.oom_control``: (``under_oom``, ``oom_kill``), None where absent
    (``oom_kill`` is missing before Linux 4.13)."""
    return _field(text, "under_oom"), _field(text, "oom_kill")


def _field(text: str, key: str) -> int | None:
    for ln in text.splitlines():
        parts = ln.split()
        if len(parts) == 2 and parts[0] == key:
            try:
                return int(parts[1])
            except ValueError:
                return None
    return None


@dataclass(frozen=True)
class OomCounters:
    """The supervisor's cgroup's OOM counters at one moment (None: not readable here)."""

    v2_oom_kill: int | None = None
    v1_oom_kill: int | None = None
    v1_under_oom: int | None = None
    v1_failcnt: int | None = None
    version: int = VERSION


def counters_rose(before: OomCounters, after: OomCounters) -> str | None:
    """Which counter says the OOM killer fired between the two readings, or None.
    ``failcnt`` alone is no kill (the kernel reclaimed and went on); it is named only with
    ``under_oom``, which means the cgroup sat at its limit with nothing left to reclaim."""

    def up(a, b):
        return a is not None and b is not None and b > a

    if up(before.v2_oom_kill, after.v2_oom_kill):
        return (f"cgroup v2 memory.events oom_kill rose "
                f"({before.v2_oom_kill} -> {after.v2_oom_kill})")
    if up(before.v1_oom_kill, after.v1_oom_kill):
        return (f"cgroup v1 memory.oom_control oom_kill rose "
                f"({before.v1_oom_kill} -> {after.v1_oom_kill})")
    if after.v1_under_oom and up(before.v1_failcnt, after.v1_failcnt):
        return (f"cgroup v1 memory.oom_control under_oom {after.v1_under_oom}, memory.failcnt "
                f"rose ({before.v1_failcnt} -> {after.v1_failcnt})")
    return None


_KMSG_PREFIX = re.compile(r"^\d+,\d+,\d+,[^;]*;")
_KILLED = re.compile(r"(?:Out of memory|Memory cgroup out of memory): Killed process (\d+)\b")
_OOM_KILL = re.compile(r"\boom-kill:.*\bpid=(\d+)\b")


def kernel_oom_kills(records: Iterable[str], pids: Iterable[int]) -> list[str]:
    """The kernel log's OOM-kill lines that name one of ``pids`` (``/dev/kmsg`` records or
    ``dmesg`` lines), without the record prefix; one line per killed pid."""
    want = {int(p) for p in pids}
    found: dict[int, str] = {}
    for rec in records:
        text = _KMSG_PREFIX.sub("", rec.split("\n", 1)[0]).strip()
        text = re.sub(r"^\[\s*\d+\.\d+\]\s*", "", text)   # dmesg's timestamp
        killed = _KILLED.search(text)
        m = killed or _OOM_KILL.search(text)
        if m and int(m.group(1)) in want and (killed or int(m.group(1)) not in found):
            found[int(m.group(1))] = text   # "Killed process" wins over "oom-kill:"
    return list(found.values())
