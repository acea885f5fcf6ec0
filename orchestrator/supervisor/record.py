"""What the supervisor's parts share while a run lives: the run's record (``state.json``
and ``events.jsonl``, written only through :class:`RunRecord`), the stop request
(:class:`Stop`) and the host's ``run.lock`` (:class:`RunLock`)."""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import time
from typing import Any, Mapping

from dfo_contract import events
from dfo_contract.beat import BEAT_FILE, Beat
from dfo_contract import runstate as rs
from dfo_contract.runstate import (Attempt, BudgetState, CheckpointRef, EvidenceLine,
                                   FallbackRecord, RunState, ThroughputLowState)
from dfo_contract.state_records import Overrides, copied

from . import runfiles


class RunRecord:
    """The run's ``state.json`` and ``events.jsonl``, and their one writer. ``state`` is the
    one live :class:`RunState`: every part reads it, and changes it only through the
    transitions below, each of which sets its fields, appends its event (:meth:`emit`, which
    also prints it on the supervisor's stdout) and writes ``state.json`` (:meth:`save`)
    where the transition is one the file shows at once. A transition that does not save is
    written with the next one that does."""

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

    # --- the supervisor's start ----------------------------------------------------------------
    def resume(self) -> str | None:
        """Take up the state a previous supervisor of the run left (``state.json``, or what
        ``events.jsonl`` tells when that is damaged); the line that says it was damaged."""
        self.state, damage = runfiles.read_state_or_events(self.run_dir)
        return damage

    def supervisor_started(self, pid: int, mode: str, *, resumed: bool) -> None:
        """This supervisor (``pid``, started by ``mode``) runs the run: ``supervisor_start``."""
        self.state.pid, self.state.mode = pid, mode
        self.emit(events.SupervisorStart(pid=pid, mode=mode, resumed=resumed))

    def recovered(self) -> bool:
        """The previous supervisor died and the run's processes are gone: no standby is
        left, and the attempt it died during ends here as a crash (an ``attempt_end`` that
        says so); saved. True when it died during an attempt."""
        state = self.state
        state.standby_pid = None
        att = state.current
        abandoned = bool(att and att.ended_at is None)
        if att and att.ended_at is None:
            att.ended_at = time.time()
            att.cls, att.reason = "crash", "the supervisor died during this attempt"
            self.emit(events.AttemptEnd(attempt=att.n, exit_code=None, signal=None,
                                        duration_s=att.ended_at - att.started_at,
                                        note="supervisor died; attempt abandoned"))
        self.save()
        return abandoned

    def running(self) -> None:
        """The run is running (its start, the end of a backoff); saved."""
        self.state.status = "running"
        self.save()

    # --- one attempt ------------------------------------------------------------------------
    def preparing(self, overrides: Overrides | None) -> None:
        """The next attempt is being prepared, with ``overrides`` (None: the config in
        force); the run is running (saved once the attempt started)."""
        if overrides is not None:
            self.state.overrides = copied(overrides)
        self.state.status = "running"

    def attempt_opened(self, n: int, *, resume: str | None, argv: list[Any], log: str) -> None:
        """Attempt N is the run's latest, started now with the config in force."""
        state = self.state
        state.attempt = n
        state.attempts.append(Attempt(n=n, started_at=time.time(), resume=resume,
                                      overrides=copied(state.overrides), argv=argv, log=log))

    def attempt_dropped(self, n: int) -> None:
        """Attempt N (the latest) never started: it is no attempt of the run."""
        self.state.attempts.pop()
        self.state.attempt = n - 1

    def attempt_started(self, n: int, pid: int, *, resume: str | None, argv: list[str],
                        log: str) -> None:
        """Attempt N's trainer runs as ``pid``: ``attempt_start``; saved."""
        att = self.state.attempts[-1]
        att.pid = pid
        self.state.trainer_pids = [pid]
        self.emit(events.AttemptStart(attempt=n, resume=resume, overrides=att.overrides,
                                      argv=argv, pid=pid, log=log))
        self.save()

    def attempt_ended(self, n: int, *, ended_at: float, exit_code: int | None,
                      signal: int | None, duration_s: float, reached_train: bool,
                      checkpointed: bool, cache_grew: bool, clock: Mapping[str, Any]) -> None:
        """Attempt N's process tree is gone (at ``ended_at``): its end in its record, no
        trainer and no throughput drop left, ``attempt_end`` (``clock``: where its time
        went); saved."""
        state = self.state
        att = state.attempts[-1]
        att.ended_at, att.exit_code, att.signal = ended_at, exit_code, signal
        att.reached_train = reached_train
        att.checkpointed = checkpointed
        att.cache_grew = cache_grew
        state.trainer_pids = []
        state.throughput_low = None
        self.emit(events.AttemptEnd(attempt=n, exit_code=exit_code, signal=signal,
                                    duration_s=round(duration_s, 3),
                                    reached_train=reached_train, **clock))
        self.save()

    def classified(self, n: int, cls: str, reason: str, *, evidence: list[EvidenceLine],
                   also: list[str]) -> None:
        """Attempt N (the latest) is of class ``cls``: its record and ``classified``."""
        att = self.state.attempts[-1]
        att.cls, att.reason = cls, reason
        self.emit(events.Classified(attempt=n, cls=cls, reason=reason, evidence=evidence,
                                    also=also))

    def cause(self, cls: str, reason: str) -> None:
        """The latest attempt's class in the run's history: the run's cause of its end."""
        att = self.state.attempts[-1]
        att.cls, att.reason = cls, reason

    def attempt_decided(self, n: int) -> None:
        """Attempt N is decided without a trainer of this node: the next is N+1."""
        self.state.attempt = n

    # --- what the watch of an attempt sees ----------------------------------------------------
    def progress(self, step: int | None, tokens_per_s: float | None,
                 baseline: float | None) -> None:
        """A step report: the run's step and tokens/s, and its healthy baseline (with the
        config it was measured with) when it has none yet; saved."""
        state = self.state
        state.last_step, state.tokens_per_s = step, tokens_per_s
        if baseline and not state.baseline_tokens_per_s:
            state.baseline_tokens_per_s = baseline
            state.baseline_overrides = copied(state.overrides)
        self.save()

    def checkpointed(self, n: int, step: int | None, path: str | None) -> None:
        """Attempt N wrote a checkpoint: the run's newest, ``checkpoint``; saved."""
        self.state.last_checkpoint = CheckpointRef(step=step, path=path)
        self.emit(events.Checkpoint(attempt=n, step=step, path=path))
        self.save()

    def evaluated(self, n: int, step: int | None, accept_len: float | None,
                  best_accept_len: float | None) -> None:
        """Attempt N's eval: the acceptance length and the best so far, ``eval``; saved."""
        self.state.accept_len, self.state.best_accept_len = accept_len, best_accept_len
        self.emit(events.Eval(attempt=n, step=step, accept_len=accept_len,
                              best_accept_len=best_accept_len))
        self.save()

    def stopping(self, n: int, reason: str) -> None:
        """The run stops during attempt N: ``stopping``; saved."""
        self.state.status = "stopping"
        self.emit(events.Stopping(attempt=n, reason=reason))
        self.save()

    def throughput_low(self, n: int, reason: str, *, since: float, cause: str, summary: str,
                       causes: list[str], seen: dict[str, Any]) -> None:
        """Attempt N's tokens/s dropped (at ``since``) and the host's samples say why:
        ``throughput_low``; saved."""
        self.state.throughput_low = ThroughputLowState(cause=cause, summary=summary,
                                                       since=since, attempt=n, reason=reason)
        self.emit(events.ThroughputLow(attempt=n, reason=reason, cause=cause, causes=causes,
                                       seen=seen, summary=summary))
        self.save()

    def throughput_ok(self, n: int, reason: str) -> None:
        """Attempt N's tokens/s is back: ``throughput_ok``; saved."""
        self.state.throughput_low = None
        self.emit(events.ThroughputOk(attempt=n, reason=reason))
        self.save()

    # --- the standby interpreter --------------------------------------------------------------
    def standby_started(self, n: int, pid: int) -> None:
        """A standby for attempt N runs as ``pid``: ``standby_start``; saved."""
        self.state.standby_pid = pid
        self.emit(events.StandbyStart(attempt=n, pid=pid))
        self.save()

    def standby_gone(self, event: events.Event) -> None:
        """The standby is gone (used by an attempt, or discarded): ``event`` says how."""
        self.state.standby_pid = None
        self.emit(event)

    # --- between attempts ---------------------------------------------------------------------
    def failure_counted(self, budget: BudgetState, *, startup: bool) -> None:
        """The restart budgets after the latest failure (``budget``), and the config of a
        failure before training (``startup``) for the next failure to compare with."""
        self.state.budget = budget
        self.state.last_startup_failure_overrides = (
            copied(self.state.overrides) if startup else None)

    def ladder_step(self, cls: str, position: int) -> None:
        """Class ``cls``'s fallback ladder is at ``position``."""
        self.state.ladder_pos[cls] = position

    def use_config(self, overrides: Overrides,
                   fallback: FallbackRecord | None = None) -> None:
        """The config the next attempt runs, and the fallback that chose it (None: none)."""
        self.state.overrides = copied(overrides)
        if fallback is not None:
            self.state.fallbacks.append(fallback)

    def follow(self, last_checkpoint: CheckpointRef | None, last_step: int | None) -> None:
        """Another node's progress is the run's: its newest checkpoint and step where it
        names them."""
        if last_checkpoint is not None:
            self.state.last_checkpoint = last_checkpoint
        if last_step is not None:
            self.state.last_step = last_step

    def backoff(self) -> None:
        """The run waits before its next attempt; saved."""
        self.state.status = "backoff"
        self.save()

    # --- the run's end ------------------------------------------------------------------------
    def ending(self, status: str, reason: str,
               evidence: list[EvidenceLine] | None = None) -> None:
        """The run ends now with ``status``: its state says so (written with :meth:`ended`,
        once run.lock and the group are let go)."""
        state = self.state
        state.status, state.reason, state.ended_at = status, reason, time.time()
        if evidence is not None:
            state.evidence = list(evidence)

    def ended(self, *, goodput: float | None, lost_s: dict[str, Any] | None) -> None:
        """The run's final word: ``final`` (its status, reason, newest checkpoint, goodput
        and time lost); saved."""
        state = self.state
        self.emit(events.Final(status=state.status, reason=state.reason or "",
                               last_checkpoint=state.last_checkpoint, goodput=goodput,
                               lost_s=lost_s))
        self.save()


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
