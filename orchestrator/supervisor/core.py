"""The supervisor: runs the trainer as attempts, watches them, classifies failures, applies
fallbacks, and keeps ``state.json`` and ``events.jsonl`` (see dfo_contract.runstate).

Decisions come from the pure modules (watchdog, classify, fallback, budget); the
:class:`Supervisor` composes the parts that do the process work, each chosen or built once
from the run's spec:

- the attempt source (``supervisor.source``, from ``spec.trainer``): an attempt's argv,
  env, directory and checkpoint, its ``run_first`` commands, the next config after a failure;
- the role (``supervisor.role``/``supervisor.group``, from ``spec.role``): solo, the head
  of a group, or a member; its hooks run at fixed points of the loop and the watch, and it
  drives the run's attempts through the supervisor's steps (``role.Driver``: run_attempt,
  judge, next_config, backoff, follow, attempt_decided, final);
- the watch of one attempt (``supervisor.watch``), the standby keeper
  (``supervisor.standby``), the run's record and ``run.lock`` (``supervisor.record``).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time

from dfo_contract import envvars, events
from dfo_contract import runstate as rs
from dfo_contract.errors import ContractError
from dfo_contract.runspec import Bundled, RunSpec
from dfo_contract.runstate import CheckpointRef, EvidenceLine, FallbackRecord, RunState
from dfo_contract.state_records import Overrides

from ..common import goodput
from .policy import oom
from ..common.budget import cannot_do_better, on_failure, restart_delay
from ..common.classify import Diagnosis, classify
from . import procs, run_dir_end, runfiles
from .group import GroupHead
from .group_member import GroupMember
from .record import BeatWriter, RunLock, RunRecord, Stop
from .role import Naming, Role, SoloRole
from .run_cache import RunCache
from .source import (AttemptSource, CannotStart, cannot_start, cannot_start_reason, done_reason,
                     fallback_record, source_for)
from .standby import Keeper, KeeperInputs
from .watch import AttemptWatch, Outcome, WatchInputs


class Supervisor:
    def __init__(self, run_dir: str):
        self.run_dir = os.path.abspath(run_dir)
        self.spec: RunSpec = runfiles.read_spec(self.run_dir)
        spec = self.spec
        self.thresholds = spec.thresholds
        self.policy = spec.budget
        self.stop = Stop()
        self.record = RunRecord(self.run_dir, RunState.new(spec.identity.run_id,
                                                           spec.identity.run_name,
                                                           now=time.time()))
        self.lock = RunLock(spec.identity.lock, spec.identity.run_id)
        self.owner_fd: int | None = None
        #: the run's own compile cache (seeded, scrubbed, restored)
        self.cache = RunCache(self.run_dir, spec.cache.restore_argv, self.record.emit)
        self.source: AttemptSource = source_for(spec, self.run_dir, self.record.emit)
        self.role: Role = role_for(spec, self.run_dir, self.record, self.stop)
        #: the standby interpreter for the next attempt (supervisor.standby)
        self.standby = Keeper(KeeperInputs(
            run_dir=self.run_dir, python=spec.identity.python, spec=spec.standby,
            thresholds=self.thresholds, config=lambda: self.source.config(self.state.overrides),
            bundled=self.bundled, attempt_env=self.source.attempt_env,
            emit=self.record.emit, started=self.record.standby_started,
            gone=self.record.standby_gone,
            own=self.source.own, group=self.role.multinode))
        self.watch = AttemptWatch(WatchInputs(
            run_dir=self.run_dir, python=spec.identity.python,
            thresholds=self.role.thresholds(self.thresholds), record=self.record, stop=self.stop,
            bundled=self.bundled, step_pattern=self.source.step_pattern,
            cpu_is_progress=self.source.cpu_is_progress, standby=self.standby,
            tick=self.role.tick, after=self.role.after_watch))

    # --- the parts' shared views ----------------------------------------------------------------
    @property
    def state(self) -> RunState:
        return self.record.state

    def bundled(self) -> Bundled | None:
        """The bundled trainer's layout, processes and dense-path expectation in force."""
        return self.source.bundled(self.state.overrides)

    # --- signals ----------------------------------------------------------------------------
    def _on_term(self, signum, _frame) -> None:
        self.stop.request(f"{signal.Signals(signum).name} to the supervisor (dfo stop)")

    def _sleep(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while self.stop.reason is None and time.monotonic() < end:
            runfiles.check_run_dir(self.run_dir)
            self.role.sync_stop()   # a stop on another node (the backoff of a group)
            time.sleep(min(0.1, max(0.0, end - time.monotonic())))

    # --- main ---------------------------------------------------------------------------------
    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_term)
        signal.signal(signal.SIGINT, self._on_term)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        try:
            return self._run()
        except CannotStart as e:   # the same argv cannot start on a retry either
            return self.final("failed", str(e))
        except (runfiles.RunDirGone, FileNotFoundError):
            if os.path.isdir(self.run_dir):
                raise
            return run_dir_end.gone(self._ending())
        except OSError as e:
            if e.errno not in run_dir_end.UNWRITABLE:
                raise
            return run_dir_end.unwritable(self._ending(), e, self.state, self._release)
        finally:
            self._release()

    def _run(self) -> int:
        try:   # never write into a run another live supervisor owns
            self.owner_fd = runfiles.own_run(self.run_dir)
        except runfiles.NotOwner as e:
            print(f"dfo-supervisor: {e}", file=sys.stderr, flush=True)
            return 0
        silent = float(self.thresholds.silent_s)
        BeatWriter(self.run_dir, every_s=min(1.0, silent / 5), silent_s=silent).start()
        resumed = os.path.exists(self.record.path(rs.STATE_FILE))
        if resumed:
            damage = self.record.resume()
            if damage:
                print(f"dfo-supervisor: {damage}", file=sys.stderr, flush=True)
            if self.state.final:
                return 0
        else:
            self.record.use_config(self.source.initial())
        owner = self.lock.take()
        if owner is not None:
            self.final("failed", f"run.lock is held by {owner}: another run is live on this host")
            return 0
        self.record.supervisor_started(
            os.getpid(), "systemd" if os.environ.get("INVOCATION_ID") else "setsid",
            resumed=resumed)
        if resumed:
            was = self.state.status
            abandoned = self._recover_after_restart()
            if was == "stopping":  # it died while stopping: finish the stop, start nothing
                return self.final("stopped", "stopped (the supervisor died while stopping)")
            cannot = self.role.restarted(int(self.state.attempt), abandoned)
            if cannot:   # a group's head: its peers' store is gone with its predecessor
                self.record.emit(events.GiveUp(cls="crash", reason=cannot, evidence=[]))
                return self.final("failed", cannot)
        self.cache.seed(int(self.state.attempt) + 1)
        self.record.running()
        self.role.open()
        return self.role.run(self)

    def _ending(self) -> run_dir_end.Ending:
        return run_dir_end.Ending(run_id=self.spec.identity.run_id, run_dir=self.run_dir,
                                  checkpoints=self.spec.resume.checkpoint_dir,
                                  kill_grace_s=self.thresholds.kill_grace_s)

    def _recover_after_restart(self) -> bool:
        """A previous supervisor died: no trainer of this run may run unwatched. True when
        it died during an attempt (now ended here, abandoned)."""
        orphans = run_dir_end.kill_run(self.run_dir, signal.SIGTERM, self.thresholds.kill_grace_s)
        if orphans:
            self.record.emit(events.OrphansReaped(pids=orphans))
        return self.record.recovered()   # its standby was reaped with the rest of the run

    def loop(self) -> int:
        """Attempts until the run ends (a solo run, or the head of a group for all nodes)."""
        record, emit, state = self.record, self.record.emit, self.state
        restore_cache = False
        while True:
            if self.stop.reason:
                return self.final("stopped", self.stop.reason)
            n = int(state.attempt) + 1
            if restore_cache:
                self.cache.restore(n)
            try:
                out = self.run_attempt(n)
            except CannotStart as e:
                emit(events.GiveUp(cls="env", reason=str(e), evidence=[]))
                return self.final("failed", str(e))
            if out.stopped:
                return self.final("stopped", self.stop.reason or "stopped")
            diag = self.judge(n, out)
            att = state.attempts[-1]
            ev = list(diag.evidence)
            diag, ending = self.role.settle(n, out, diag)   # a group: one root cause
            diag = self.cache.with_repair(out, diag)
            record.cause(diag.cls, diag.reason)              # the run's history: its cause
            if ending is not None:
                return self.final(*ending)
            if diag.cls == "done":
                return self.final("done", done_reason(state.last_step, self.source.own))
            if out.stopped or self.stop.reason:
                return self.final("stopped", self.stop.reason or "stopped")
            budget = dataclasses.replace(state.budget, counts=dict(state.budget.counts))
            dec = on_failure(self.policy, budget, diag.cls, healthy_s=out.healthy_s,
                             startup=not out.reached_train, permanent=diag.permanent,
                             same_config_as_last_startup_failure=(
                                 state.last_startup_failure_overrides == state.overrides))
            record.failure_counted(budget, startup=not out.reached_train)
            if not dec.restart:
                emit(events.GiveUp(cls=diag.cls, reason=dec.reason, evidence=ev))
                return self.final("failed", f"{diag.cls} ({diag.reason}): {dec.reason}",
                                  evidence=ev)
            pos = int(state.ladder_pos.get(diag.cls, 0))
            choice = self.source.next_choice(diag.cls, pos, state.overrides)
            if choice.exhausted:
                reason = f"{diag.cls}: fallback ladder spent ({choice.spent})"
                emit(events.GiveUp(cls=diag.cls, reason=reason, evidence=ev))
                return self.final("failed", reason, evidence=ev)
            # a node of the group whose cache the restart clears changes the next attempt too
            cleared = self.cache.scrub(n + 1, out, diag) or self.role.clears_caches(n)
            why = cannot_do_better(state.attempts[-2] if len(state.attempts) > 1 else None,
                                   att, restart_changes_config=bool(choice.changed) or cleared)
            if why:
                reason = f"{diag.cls} ({diag.reason}): {why}"
                emit(events.GiveUp(cls=diag.cls, reason=why, evidence=ev))
                return self.final("failed", reason, evidence=ev)
            record.ladder_step(diag.cls, choice.position)
            self.next_config(choice.overrides, fallback_record(diag.cls, choice, n))
            fb = emit(events.Fallback(attempt=n, cls=diag.cls, step=choice.step,
                                      changed=choice.changed, overrides=choice.overrides,
                                      restore_cache=choice.restore_cache,
                                      note=choice.note or None))
            restore_cache = choice.restore_cache
            delay = restart_delay(self.policy, dec, diag.cls,
                                  config_changed=bool(choice.changed))
            rst = emit(events.Restart(attempt=n + 1, delay_s=round(delay, 3),
                                      reason=dec.reason))
            self.role.on_restart(n, fb, rst)
            self.backoff(delay)

    def final(self, status: str, reason: str,
              evidence: list[EvidenceLine] | None = None) -> int:
        """The run ends. run.lock (and the group) are let go BEFORE the final status shows in
        events.jsonl and state.json: whoever sees the run final may launch the next one."""
        self.record.ending(status, reason, evidence)
        self.role.on_final(status, reason)
        self.standby.discard(f"the run ended ({status})")
        self._release()   # a final state means the host is free: the next launch may start
        g = self._goodput()
        self.record.ended(goodput=g.goodput if g else None, lost_s=g.lost_s if g else None)
        return 0

    def _goodput(self):
        """The run's goodput and time lost so far (common.goodput), for its final event; None
        when its events cannot be read (the final is written all the same)."""
        try:
            return goodput.account(events.read_events_file(self.record.path(rs.EVENTS_FILE)),
                                   now=time.time(), mono=time.monotonic())
        except (OSError, ValueError, ContractError):
            return None

    def _release(self) -> None:
        """Leave the group (the head waits for its peers) and give run.lock back; once."""
        self.role.release()
        self.lock.release()

    # --- one attempt: the steps a role drives (role.Driver) -------------------------------
    def run_attempt(self, n: int, overrides: Overrides | None = None) -> Outcome:
        """Start attempt N (with ``overrides``: that config; None: the run's) and watch it
        to its end."""
        record, state = self.record, self.state
        record.preparing(overrides)
        launch = self.source.launch(n, state, self.role)
        argv, env, cwd = launch.argv, launch.env, launch.cwd
        missing = cannot_start(argv, env, self.spec.identity, self.source.own)
        if missing:
            raise CannotStart(missing)
        log_name = rs.attempt_log_name(n)
        log_path = record.path(log_name)
        record.attempt_opened(n, resume=launch.resume, argv=argv, log=log_name)
        self.source.run_first(n, launch, log_path, timeout=self.thresholds.warmup_s)
        oom_before = procs.oom_counters()
        ckpt_before = state.last_checkpoint
        cache_before = self.cache.size()
        klog = procs.KernelLog()
        env[envvars.SPAWN_T] = f"{time.time():.3f}"  # the trainer's startup breakdown counts from here
        proc = self.standby.take(n, argv, env, cwd, log_path)
        if proc is None:
            with open(log_path, "ab") as logf:
                try:
                    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=logf,
                                            stderr=logf, env=env, cwd=cwd,
                                            start_new_session=True,
                                            preexec_fn=procs.set_pdeathsig)
                except OSError as e:
                    record.attempt_dropped(n)   # it never started: no attempt of the run
                    raise CannotStart(cannot_start_reason(argv, cwd, e)) from None
        record.attempt_started(n, proc.pid, resume=launch.resume, argv=argv, log=log_name)
        try:
            out = self.watch.watch(n, proc, log_path)
            kernel = oom.kernel_oom_kills(klog.read(), out.pids_seen | {proc.pid})
        finally:
            klog.close()
        counters = oom.counters_rose(oom_before, procs.oom_counters())
        # the kernel's line names a process of this attempt; a counter of the cgroup counts
        # only for an attempt that died of SIGKILL (another process may have been the victim)
        out.oom_reason = (f"the kernel's OOM killer: {kernel[0]}" if kernel else
                          f"killed by the kernel's OOM killer ({counters})"
                          if counters and out.signal == signal.SIGKILL else None)
        out.oom_killed = out.oom_reason is not None
        ended_at = time.time()
        checkpointed = state.last_checkpoint != ckpt_before
        grown = self.cache.size()
        record.attempt_ended(n, ended_at=ended_at, exit_code=out.exit_code, signal=out.signal,
                             duration_s=out.duration_s, reached_train=out.reached_train,
                             checkpointed=checkpointed,
                             cache_grew=grown[0] > cache_before[0] or grown[1] > cache_before[1],
                             clock=out.clock.fields())
        return out

    def judge(self, n: int, out: Outcome, *, name: Naming | None = None) -> Diagnosis:
        """Attempt N's diagnosis (common.classify), recorded as the attempt's class and in
        its ``classified`` event; ``name``: the class and reason this node gives its end
        instead (a group's member: another node's abort)."""
        diag = classify(out.scan, exit_code=out.exit_code, signal=out.signal, hang=out.hang,
                        oom_killed=out.oom_killed, oom_reason=out.oom_reason,
                        collapse=out.collapse, frozen=out.frozen, own=self.source.own)
        cls, reason = name(diag) if name is not None else (diag.cls, diag.reason)
        self.record.classified(n, cls, reason, evidence=list(diag.evidence),
                               also=list(diag.also))
        return diag

    def next_config(self, overrides: Overrides, fallback: FallbackRecord | None) -> None:
        """The run's decision on the last attempt: the config the next one runs and the
        fallback that made it (None: none)."""
        self.record.use_config(overrides, fallback)

    def backoff(self, delay_s: float = 0.0) -> None:
        """The run waits ``delay_s`` (a stop ends the wait) before its next attempt: its
        state says ``backoff`` meanwhile and ``running`` after a wait."""
        self.record.backoff()
        if delay_s > 0:
            self._sleep(delay_s)
            self.record.running()

    def follow(self, last_checkpoint: CheckpointRef | None, last_step: int | None) -> None:
        """Another node's progress is the run's (a group's member follows its head): its
        newest checkpoint and step where it names them."""
        self.record.follow(last_checkpoint, last_step)

    def attempt_decided(self, n: int) -> None:
        """Attempt N is decided without a trainer of this node (its part could not start):
        the next attempt is N+1."""
        self.record.attempt_decided(n)


def role_for(spec: RunSpec, run_dir: str, record: RunRecord, stop: Stop) -> Role:
    """This node's role, from the spec's ``role``: solo, the group's head or a member."""
    gs = spec.group
    if gs is None:
        return SoloRole()
    cls = GroupHead if gs.is_head else GroupMember
    return cls(gs, spec.identity.run_id, run_dir, spec.thresholds.kill_grace_s, record, stop)

