"""The supervisor's heartbeat: ``<run dir>/supervisor.beat``, rewritten every ``every_s``
seconds while its process runs (a thread of its own, so a long copy or command of the main
loop does not silence it; a process stopped by SIGSTOP, a debugger or a frozen cgroup does).
Readers on the same host (``dfo status``'s query) measure its age on the host's monotonic
clock, which no step of the wall clock moves; past ``silent_s`` the supervisor is not
responding. The file is one JSON object, :class:`Beat` read and written by
``dfo_contract.codec``."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from .codec import decode, encode

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
        out: dict[str, Any] = encode(self)
        return out

    @classmethod
    def from_json(cls, obj: Any) -> "Beat":
        """ContractError (a ValueError) when ``obj`` is not a heartbeat."""
        return decode(cls, obj, what="a heartbeat")

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
