"""What the supervisor's parts share while a run lives: the run's record (``state.json``
and ``events.jsonl``, written only through :class:`RunRecord`), the stop request
(:class:`Stop`) and the host's ``run.lock`` (:class:`RunLock`)."""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import time

from dfo_contract import events
from dfo_contract.beat import BEAT_FILE, Beat
from dfo_contract import runstate as rs
from dfo_contract.runstate import RunState

from . import runfiles


class RunRecord:
    """The run's ``state.json`` and ``events.jsonl``. ``state`` is the one live
    :class:`RunState` every part reads and updates; :meth:`save` writes it, :meth:`emit`
    appends an event (and prints it on the supervisor's stdout)."""

    def __init__(self, run_dir: str, state: RunState):
        self.run_dir = run_dir
        self.state = state

    def path(self, *parts: str) -> str:
        return os.path.join(self.run_dir, *parts)

    def save(self) -> None:
        self.state.updated_at = time.time()
        runfiles.write_state(self.run_dir, self.state)

    def emit(self, event: events.Event) -> events.Event:
        event = dataclasses.replace(event, mono=round(time.monotonic(), 3))
        runfiles.append_event(self.path(rs.EVENTS_FILE), event)
        self.state.last_event = event.describe()
        print(f"dfo-supervisor: {self.state.last_event}", flush=True)
        return event


class Stop:
    """Why the run is to stop (None: it is not): a signal to the supervisor, or a stop
    another node of the group asked for. The first reason given stays."""

    def __init__(self) -> None:
        self.reason: str | None = None

    def request(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason


class RunLock:
    """``locks/run.lock``: held (``flock``) by the live run's supervisor, its content the run
    id. The fd is close-on-exec, so no child (attempt, standby, ``run_first`` command)
    holds the lock after the supervisor let it go.

    Others take the lock for a moment only: the launch probe tests it with
    ``flock -n run.lock true`` (and polls so while a launch waits for its supervisor), and
    deploy's switch holds it while it renames ``envs/current``. So a lock that is busy is
    tried again for ``grace_s`` before it counts as another run's: only a live run holds it
    that long."""

    #: how long a busy run.lock is tried again before another run is taken to hold it
    GRACE_S = 5.0
    RETRY_S = 0.01

    def __init__(self, path: str, run_id: str, *, grace_s: float = GRACE_S):
        self.path = path
        self.run_id = run_id
        self.grace_s = grace_s
        self.fd: int | None = None

    def take(self) -> str | None:
        """None once held; else who holds it (its content, or "another run")."""
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        holder = runfiles.lock_with_owner(fd, self.run_id, wait_s=self.grace_s,
                                          retry_s=self.RETRY_S)
        if holder is not None:
            return holder or "another run"
        self.fd = fd
        return None

    def release(self) -> None:
        """Give the lock back (once; a no-op when it is not held)."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class BeatWriter:
    """``supervisor.beat`` (dfo_contract.beat), rewritten every ``every_s`` by a daemon
    thread while this process runs; a write that fails (a full or read-only directory) is
    tried again at the next beat and never ends the run."""

    def __init__(self, run_dir: str, *, every_s: float, silent_s: float):
        self.path = os.path.join(run_dir, BEAT_FILE)
        self.every_s, self.silent_s = every_s, silent_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self.write()
        self._thread = threading.Thread(target=self._beat, name="dfo-beat-file",
                                        daemon=True)
        self._thread.start()

    def write(self) -> None:
        beat = Beat(pid=os.getpid(), mono=round(time.monotonic(), 3), t=round(time.time(), 3),
                    every_s=self.every_s, silent_s=self.silent_s)
        tmp = f"{self.path}.tmp-{os.getpid()}"
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(beat.to_json(), f)
            os.replace(tmp, self.path)
        except OSError:
            pass

    def _beat(self) -> None:
        while not self._stop.wait(self.every_s):
            self.write()

    def stop(self) -> None:
        self._stop.set()
