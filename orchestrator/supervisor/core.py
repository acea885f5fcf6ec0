"""The supervisor: runs the trainer as attempts, watches them, classifies failures, applies
fallbacks, and keeps ``state.json`` and ``events.jsonl`` (see orchestrator.ops.runstate).

Decisions come from the pure modules (watchdog, classify, fallback, budget); this module
only does the process work: start an attempt, classify how it ended, pick the next config,
wait. Watching a running attempt is ``supervisor.watch``.
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

from dfo_contract import envvars, events
from dfo_contract.checkpoints import newest_of_run
from dfo_contract.errors import ContractError
from dfo_contract.runspec import Bundled, RunSpec

from ..ops import runstate as rs
from ..ops import byo as byo_ops
from ..ops.budget import BudgetState, on_failure, restart_delay
from ..ops.classify import classify
from ..ops.fallback import next_config
from ..ops.classify import NODE_LOST
from ..ops.launch_argv import Rendezvous, attempt_env, ddp_nproc, group_env, trainer_argv
from ..ops.runstate import Attempt, RunState
from . import byo as byo_sup
from . import group, procs, runfiles
from .standby import Keeper
from .watch import AttemptWatch, Outcome


@dataclass(frozen=True)
class _Choice:
    """A foreign command's ladder choice, shaped like ``ops.fallback.Choice``."""
    step: str | None
    overrides: dict
    position: int
    changed: dict
    restore_cache: bool
    exhausted: bool
    spent: str


class Supervisor(AttemptWatch):
    def __init__(self, run_dir: str):
        self.run_dir = os.path.abspath(run_dir)
        self.spec: RunSpec = runfiles.read_spec(self.run_dir)
        self.t = self.spec.thresholds
        self.policy = self.spec.budget
        self.stop_reason: str | None = None
        self.state = RunState.new(self.spec.identity.run_id, self.spec.identity.run_name,
                                  now=time.time())
        self.lock_fd: int | None = None
        #: a multi-node run (spec ``role``): this node's part, its coordinator, the plan
        self.group = self.spec.group
        self.coord: group.Coordinator | None = None
        self.plan: dict | None = None
        #: the standby interpreter for the next attempt (supervisor.standby)
        self.standby = Keeper(self)

    # --- files ------------------------------------------------------------------------------
    def _p(self, *parts: str) -> str:
        return os.path.join(self.run_dir, *parts)

    def save(self) -> None:
        self.state.updated_at = time.time()
        runfiles.write_state(self.run_dir, self.state)

    def emit(self, event: events.Event) -> events.Event:
        runfiles.append_event(self._p(rs.EVENTS_FILE), event)
        self.state.last_event = event.describe()
        print(f"dfo-supervisor: {self.state.last_event}", flush=True)
        return event

    # --- signals ----------------------------------------------------------------------------
    def _on_term(self, signum, _frame) -> None:
        if self.stop_reason is None:
            self.stop_reason = f"{signal.Signals(signum).name} to the supervisor (dfo stop)"

    def _sleep(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while self.stop_reason is None and time.monotonic() < end:
            if self.coord is not None:   # a stop on another node (the backoff of a group)
                group.sync_stop(self)
            time.sleep(min(0.1, max(0.0, end - time.monotonic())))

    # --- lock -------------------------------------------------------------------------------
    def _take_lock(self) -> str | None:
        path = self.spec.identity.lock
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = os.pread(fd, 200, 0).decode("utf-8", "replace").strip()
            os.close(fd)
            return owner or "another run"
        os.ftruncate(fd, 0)
        os.pwrite(fd, (self.spec.identity.run_id + "\n").encode(), 0)
        self.lock_fd = fd
        return None

    # --- main ---------------------------------------------------------------------------------
    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_term)
        signal.signal(signal.SIGINT, self._on_term)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        try:   # never write into a run another live supervisor owns
            self.owner_fd = runfiles.own_run(self.run_dir)
        except runfiles.NotOwner as e:
            print(f"dfo-supervisor: {e}", file=sys.stderr, flush=True)
            return 0
        resumed = os.path.exists(self._p(rs.STATE_FILE))
        if resumed:
            self.state = runfiles.read_state(self.run_dir)
            if self.state.final:
                return 0
        else:
            self.state.overrides = dict(self.spec.config.overrides)
        owner = self._take_lock()
        if owner is not None:
            self._final("failed", f"run.lock is held by {owner}: another run is live on this host")
            return 0
        self.state.pid = os.getpid()
        self.state.mode = "systemd" if os.environ.get("INVOCATION_ID") else "setsid"
        self.emit(events.SupervisorStart(pid=os.getpid(), mode=self.state.mode, resumed=resumed))
        if resumed:
            was = self.state.status
            self._recover_after_restart()
            if was == "stopping":  # it died while stopping: finish the stop, start nothing
                return self._final("stopped", "stopped (the supervisor died while stopping)")
        self.state.status = "running"
        self.save()
        try:
            if self.group is not None:
                self.coord = group.open_for(self)
                if not self.group.is_head:
                    return group.run_peer(self)
            return self._loop()
        finally:
            self._release()

    def _recover_after_restart(self) -> None:
        """A previous supervisor died: no trainer of this run may run unwatched."""
        orphans = procs.processes_of_run(self.run_dir)
        if orphans:
            procs.signal_all(orphans, signal.SIGTERM)
            if not procs.wait_gone(orphans, self.t.kill_grace_s):
                procs.signal_all(orphans, signal.SIGKILL)
                procs.wait_gone(orphans, 5)
            self.emit(events.OrphansReaped(pids=orphans))
        self.state.standby_pid = None      # reaped above with the rest of the run
        att = self.state.current
        if att and att.ended_at is None:
            att.ended_at = time.time()
            att.cls, att.reason = "crash", "the supervisor died during this attempt"
            self.emit(events.AttemptEnd(attempt=att.n, exit_code=None, signal=None,
                                        duration_s=att.ended_at - att.started_at,
                                        note="supervisor died; attempt abandoned"))
        self.save()

    def _loop(self) -> int:
        restore_cache = False
        while True:
            if self.stop_reason:
                return self._final("stopped", self.stop_reason)
            n = int(self.state.attempt) + 1
            if restore_cache:
                self._restore_cache(n)
            out = self._run_attempt(n)
            if out.stopped:
                return self._final("stopped", self.stop_reason or "stopped")
            diag = classify(out.scan, exit_code=out.exit_code, signal=out.signal, hang=out.hang,
                            oom_killed=out.oom_killed, collapse=out.collapse)
            att = self.state.attempts[-1]
            att.cls, att.reason = diag.cls, diag.reason
            ev = [e.to_json() for e in diag.evidence]
            self.emit(events.Classified(attempt=n, cls=diag.cls, reason=diag.reason,
                                        evidence=ev, also=list(diag.also)))
            if self.coord is not None:   # the head: every node's end, one root cause
                diag = group.settle_head(self, n, out, diag)
                if out.stopped or self.stop_reason:
                    return self._final("stopped", self.stop_reason or "stopped")
                if diag.cls == NODE_LOST:
                    self.emit(events.GiveUp(cls=diag.cls, reason=diag.reason, evidence=[]))
                    return self._final("failed", diag.reason)
            if diag.cls == "done":
                return self._final("done", f"reached max_steps at step {self.state.last_step}")
            if out.stopped or self.stop_reason:
                return self._final("stopped", self.stop_reason or "stopped")
            bstate = BudgetState.from_json(self.state.budget)
            dec = on_failure(self.policy, bstate, diag.cls, healthy_s=out.healthy_s,
                             startup=not out.reached_train, permanent=diag.permanent,
                             same_config_as_last_startup_failure=(
                                 self.state.last_startup_failure_overrides
                                 == self.state.overrides))
            self.state.budget = bstate.to_json()
            self.state.last_startup_failure_overrides = (
                dict(self.state.overrides) if not out.reached_train else None)
            if not dec.restart:
                self.emit(events.GiveUp(cls=diag.cls, reason=dec.reason, evidence=ev))
                return self._final("failed", f"{diag.cls} ({diag.reason}): {dec.reason}",
                                   evidence=ev)
            pos = int(self.state.ladder_pos.get(diag.cls, 0))
            if self.spec.own is not None:
                choice = self._byo_choice(diag.cls, pos)
            else:
                ladder = list(self.spec.ladders.get(diag.cls, ()))
                base = dict(self.spec.config.base)
                choice = next_config(diag.cls, ladder, pos, base, dict(self.state.overrides))
            if choice.exhausted:
                reason = f"{diag.cls}: fallback ladder spent ({choice.spent})"
                self.emit(events.GiveUp(cls=diag.cls, reason=reason, evidence=ev))
                return self._final("failed", reason, evidence=ev)
            self.state.ladder_pos[diag.cls] = choice.position
            self.state.overrides = choice.overrides
            if choice.step and choice.step != "same":
                self.state.fallbacks.append({"class": diag.cls, "step": choice.step,
                                             "changed": choice.changed, "attempt": n})
            fb = self.emit(events.Fallback(attempt=n, cls=diag.cls, step=choice.step,
                                           changed=choice.changed, overrides=choice.overrides,
                                           restore_cache=choice.restore_cache))
            restore_cache = choice.restore_cache
            self.state.status = "backoff"
            delay = restart_delay(self.policy, dec, diag.cls,
                                  config_changed=bool(choice.changed))
            rst = self.emit(events.Restart(attempt=n + 1, delay_s=round(delay, 3),
                                           reason=dec.reason))
            if self.coord is not None:
                group.decide(self, n, "restart", fallback=fb, restart=rst)
            self.save()
            self._sleep(delay)
            self.state.status = "running"
            self.save()

    def _byo_choice(self, cls: str, pos: int) -> "_Choice":
        ladder = list(self.spec.own.fallbacks.get(cls, ()))
        c = byo_ops.next_step(cls, ladder, pos, byo_ops.Changes.from_json(self.state.overrides))
        return _Choice(c.step, c.changes.to_json(), c.position, c.changed, False, c.exhausted,
                       " -> ".join(byo_ops.describe_step(s) for s in ladder) or "empty")

    def _final(self, status: str, reason: str, evidence: list | None = None) -> int:
        self.state.status, self.state.reason, self.state.ended_at = status, reason, time.time()
        if evidence is not None:
            self.state.evidence = evidence
        if self.coord is not None:
            group.on_final(self, status, reason)
        self.standby.discard(f"the run ended ({status})")
        self._release()   # a final state means the host is free: the next launch may start
        self.emit(events.Final(status=status, reason=reason,
                               last_checkpoint=self.state.last_checkpoint))
        self.save()
        return 0

    def _release(self) -> None:
        """Leave the group (the head waits for its peers) and give run.lock back; once."""
        if self.coord is not None:
            self.coord.close()
            self.coord = None
        if self.lock_fd is not None:
            os.close(self.lock_fd)
            self.lock_fd = None

    # --- one attempt ------------------------------------------------------------------------
    def _resume_target(self) -> str | None:
        """Once this run has saved a checkpoint: the newest one whose manifest verifies and
        names this run (torn/corrupt ones are skipped and reported; another run's are never
        taken, even when newer). Else: exactly the checkpoint launch was given (--resume),
        else None (from scratch)."""
        if not self.state.last_checkpoint:
            return self.spec.resume.path  # this run saved nothing yet: what launch was given
        info, skipped = newest_of_run(self.spec.resume.checkpoint_dir, self.spec.identity.run_id)
        for c in skipped:
            self.emit(events.Watchdog(attempt=self.state.attempt + 1,
                                      reason=f"skipping checkpoint {c.name}: {c.reason}"))
        return (info.path if info else None) or self.spec.resume.path

    def _config(self) -> dict:
        return self.spec.config.merged(self.state.overrides)

    def _attempt_env(self, n: int) -> dict[str, str]:
        env = dict(os.environ)
        tr = self.spec.trainer
        env.update(attempt_env(self.spec.cache.env, attempt=n, run_dir=self.run_dir,
                               fault=tr.fault if isinstance(tr, Bundled) else None,
                               run_id=self.spec.identity.run_id))
        return env

    def _run_attempt(self, n: int) -> Outcome:
        cfg = self._config()
        env = self._attempt_env(n)
        cwd = self.run_dir
        own = self.spec.own
        if own is not None:          # a foreign command (dfo launch -- CMD ARGS...)
            changes = byo_ops.Changes.from_json(self.state.overrides)
            resume = byo_sup.resume_target(own, self.run_dir,
                                           since=float(self.state.started_at or 0) - 1.0) \
                or self.spec.resume.path
            argv = byo_sup.argv(own, changes, resume)
            env = byo_sup.env(own, self.spec.identity.python, changes, env)
            cwd = byo_sup.cwd(own, self.run_dir)
        else:
            changes = None
            gs, rdzv = self.group, None
            resume = self._resume_target() if self.plan is None else self.plan.get("resume")
            if gs is not None:
                rdzv = Rendezvous(gs.nnodes, gs.head_addr, gs.port, gs.rdzv_id(
                    self.spec.identity.run_id, n), is_host=gs.is_head,
                    local_addr=group.local_addr(gs.head_addr, gs.port))
                env.update(group_env(gs.node, gs.env))
                if gs.is_head:
                    group.plan_for(self, n, resume)
            argv = trainer_argv(self.spec.identity.python, self.spec.config.path,
                                self.state.overrides, run_dir=self.run_dir,
                                checkpoint_dir=self.spec.resume.checkpoint_dir, resume=resume,
                                layout=cfg.get("parallel.layout"),
                                nproc=gs.nproc if gs else ddp_nproc(cfg), rdzv=rdzv)
        log_name = rs.attempt_log_name(n)
        log_path = self._p(log_name)
        self.state.attempt = n
        att = Attempt(n=n, started_at=time.time(), resume=resume,
                      overrides=dict(self.state.overrides), argv=argv, log=log_name)
        self.state.attempts.append(att)
        if changes is not None and changes.first:
            ok, why = byo_sup.run_first(changes.first, env, cwd, log_path,
                                        timeout=self.t.warmup_s)
            self.emit(events.RunFirst(attempt=n, commands=changes.first, ok=ok, detail=why))
        oom_before = procs.cgroup_oom_kills()
        env[envvars.SPAWN_T] = f"{time.time():.3f}"  # the trainer's startup breakdown counts from here
        proc = self.standby.take(n, argv, env, cwd, log_path)
        if proc is None:
            with open(log_path, "ab") as logf:
                proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=logf,
                                        stderr=logf, env=env, cwd=cwd, start_new_session=True,
                                        preexec_fn=procs.set_pdeathsig)
        att.pid = proc.pid
        self.state.trainer_pids = [proc.pid]
        self.emit(events.AttemptStart(attempt=n, resume=resume, overrides=att.overrides,
                                      argv=argv, pid=proc.pid, log=log_name))
        self.save()
        out = self._watch(n, proc, log_path)
        oom_after = procs.cgroup_oom_kills()
        out.oom_killed = (oom_before is not None and oom_after is not None
                          and oom_after > oom_before and out.signal == signal.SIGKILL)
        att.ended_at, att.exit_code, att.signal = time.time(), out.exit_code, out.signal
        self.state.trainer_pids = []
        self.state.throughput_low = None
        self.emit(events.AttemptEnd(attempt=n, exit_code=out.exit_code, signal=out.signal,
                                    duration_s=round(out.duration_s, 3),
                                    reached_train=out.reached_train))
        self.save()
        return out

    def _restore_cache(self, n: int) -> None:
        argv = list(self.spec.cache.restore_argv or ())
        if not argv:
            self.emit(events.CacheRestore(
                attempt=n, ok=False,
                detail="no cache to restore from; continuing with the run's cache as it is"))
            return
        p = subprocess.run(argv, capture_output=True, text=True)
        tail = (p.stderr or p.stdout).strip().splitlines()[-1:] if p.returncode else []
        self.emit(events.CacheRestore(
            attempt=n, ok=p.returncode == 0,
            detail="the run's cache kept (what the failed attempt built) and topped up "
            "from the host's live cache"
            if p.returncode == 0 else f"restore failed: {' '.join(tail)}"))


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m orchestrator.supervisor")
    ap.add_argument("--run-dir", required=True)
    a = ap.parse_args(argv)
    try:
        return Supervisor(a.run_dir).run()
    except (FileNotFoundError, ContractError) as e:
        print(f"dfo-supervisor: {e}", file=sys.stderr)
        return 0  # nothing it can supervise: never restart-loop on it
