"""The supervisor's heartbeat: ``<run dir>/supervisor.beat``, rewritten every ``every_s``
seconds while its process runs (a thread of its own, so a long copy or command of the main
loop does not silence it; a process stopped by SIGSTOP, a debugger or a frozen cgroup does).
Readers on the same host (``dfo status``'s query) measure its age on the host's monotonic
clock, which no step of the wall clock moves; past ``silent_s`` the supervisor is not
responding."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

BEAT_FILE = "supervisor.beat"
BEAT_VERSION = 1


@dataclass(frozen=True)
class Beat:
    pid: int
    mono: float        # the writer's CLOCK_MONOTONIC when written
    t: float           # its epoch seconds then
    every_s: float     # how often it is rewritten
    silent_s: float    # older than this: the supervisor is not responding
    version: int = BEAT_VERSION

    def to_json(self) -> dict[str, Any]:
        return {"pid": self.pid, "mono": self.mono, "t": self.t, "every_s": self.every_s,
                "silent_s": self.silent_s, "version": self.version}

    @classmethod
    def from_json(cls, obj: Any) -> "Beat":
        if not isinstance(obj, dict):
            raise ValueError("a heartbeat is not a JSON object")
        try:
            return cls(pid=int(obj["pid"]), mono=float(obj["mono"]), t=float(obj["t"]),
                       every_s=float(obj["every_s"]), silent_s=float(obj["silent_s"]),
                       version=int(obj.get("version", BEAT_VERSION)))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"not a heartbeat ({e})") from None

    def age(self, mono_now: float) -> float:
        """Seconds since it was written, by the reader's monotonic clock (same host)."""
        return max(0.0, mono_now - self.mono)


def read_beat(run_dir: str, pid: int | None) -> Beat | None:
    """The heartbeat of supervisor ``pid`` in ``run_dir`` (None: none, unreadable, or
    another process's)."""
    try:
        with open(os.path.join(run_dir, BEAT_FILE), encoding="utf-8") as f:
            beat = Beat.from_json(json.load(f))
    except (OSError, ValueError):
        return None
    return beat if pid is not None and beat.pid == pid else None
