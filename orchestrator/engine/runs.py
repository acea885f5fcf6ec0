"""launch / status / stop through a Transport. Decisions come from plan.launch_plan (pure).

``RunOps(transport, host).plan(opts)`` loads the run config (or your own trainer's run
file) and checks everything given before anything touches the host
(``plan.launch_inputs.prepare``), then asks the host ONE command for every fact the plan needs
(``engine.preflight``: env deployed and ``dfo deploy --check``-clean, run.lock, the
config's paths, the cache key's inputs, the checkpoints by manifest, a resume glob) and
plans (``plan.launch_plan.plan_launch``). ``launch(opts)`` then writes the run dir
(config.yaml, spec.json) and starts the supervisor detached (systemd-run, or setsid) in ONE
more command (``plan.launch_steps``; the supervisor seeds the run's own compile cache), and
waits until the supervisor has taken run.lock. Ctrl-C during a launch ends in
:class:`~orchestrator.common.errors.Interrupted`, saying whether the run started.
"""

from __future__ import annotations

import logging
import math
import posixpath
import time
from pathlib import Path
from typing import Callable

from dfo_contract import runstate as rs
from dfo_contract.replies import LaunchProbeReply, RunStep, StepsReply, WriteStep
from dfo_contract.status import LOST, NEVER_STARTED, QueryReply, RunStatus

from ..common.errors import (ConnectError, DfoError, HostKeyError, Interrupted, LockHeldError,
                      RemoteCommandError, RunFailed)
from ..plan import launch_inputs as li
from ..plan import launch_plan as lp
from ..plan import launch_steps as ls
from ..plan.probes import launch_probe
from ..plan.run_identity import cut_off_error
from ..transport.base import Result
from .preflight import launch_facts
from .run_query import RunQueries, StopOutcome

LaunchOptions = li.LaunchOptions   # what ``dfo launch`` was asked (pure data, plan.launch_inputs)

log = logging.getLogger("dfo")


def load_trainer(o: LaunchOptions, tree) -> li.TrainerInput:
    """The run config (one parse, ``--set`` applied once:
    ``config.runconfig.load_run_layers``; without ``--config`` the default of the host of
    ``tree``), or your own trainer's run file: local files only."""
    if o.own:
        from ..config.own_runfile import read_run_file
        from ..plan.launch_own import own_config

        rf, data = read_run_file(o.run_file) if o.run_file else ({}, None)
        return own_config(o, rf, data)
    from ..config.runconfig import DEFAULT_RUN_NAME, load_run_layers

    layers = load_run_layers(o.config, tree, li.parse_sets(o.sets))
    name = Path(o.config).stem if o.config else DEFAULT_RUN_NAME
    return li.BundledConfig(source=o.config, name=name, layers=layers)


class RunOps:
    """launch, status and stop of runs on one host. Reading and stopping runs is its
    ``queries`` (``RunQueries``); ``status``, ``current_run``, ``stop``, ``query`` and
    ``one`` here are that object's."""

    def __init__(self, transport, host, *, say: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.time, deploy_with: str | None = None):
        self.transport = transport
        self.host = host
        #: what a missing env's hint tells to run (a group member: ``--group NAME``)
        self.deploy_with = deploy_with or f"--host {host.name}"
        self.tree = host.tree
        self.say = say or (lambda msg: log.info("%s", msg))
        self.clock = clock
        self.queries = RunQueries(transport, self.tree, host.name,
                                  deploy_with=self.deploy_with)
        self._launching: str | None = None   # the run id a launch allocated (for messages)

    @property
    def python(self) -> str:
        return self.tree.current_python

    # --- reading and stopping runs (RunQueries) ------------------------------------------------
    def query(self, run: str | None = None) -> QueryReply:
        return self.queries.query(run)

    def status(self, run: str | None = None) -> list[RunStatus]:
        return self.queries.status(run)

    def current_run(self, run: str | None = None) -> str:
        return self.queries.current_run(run)

    def one(self, run_id: str) -> RunStatus:
        return self.queries.one(run_id)

    def stop(self, run: str | None = None, *, timeout: float = 180.0,
             wait: bool = True) -> StopOutcome:
        return self.queries.stop(run, timeout=timeout, wait=wait)

    # --- probes ----------------------------------------------------------------------------
    def probe(self) -> LaunchProbeReply:
        p = launch_probe(self.tree.root, self.tree.run_lock)
        r = self.transport.run(list(p.argv), timeout=60)
        r.check(f"probing {self.host.name}")
        return p.parse(r)

    # --- plan -------------------------------------------------------------------------------
    def prepare(self, o: LaunchOptions, trainer: li.TrainerInput | None = None
                ) -> li.LaunchInputs:
        """Everything checked that can be without the host (before anything touches it);
        ``trainer``: ``o``'s trainer input, already loaded (a group's ``--config``)."""
        return li.prepare(o, trainer or load_trainer(o, self.tree), self.host, self.clock())

    def facts(self, o: LaunchOptions, inp: li.LaunchInputs):
        """The host's facts: ONE round trip (engine.preflight)."""
        return launch_facts(self, o, inp)

    def plan(self, o: LaunchOptions) -> lp.LaunchPlan:
        inp = self.prepare(o)
        return lp.plan_launch(o, inp, self.facts(o, inp), host=self.host)

    # --- launch -----------------------------------------------------------------------------
    def launch(self, o: LaunchOptions) -> lp.LaunchPlan:
        self._launching = None
        try:
            return self._launch(o)
        except HostKeyError:
            raise
        except ConnectError as e:
            raise cut_off_error(e, self.host.name, self._launching) from None
        except KeyboardInterrupt:
            raise self._interrupted(self._launching) from None

    def _interrupted(self, run_id: str | None) -> Interrupted:
        """What a Ctrl-C during a launch left: nothing (before the run's steps were sent),
        or the run as the host shows it once those steps are over (once sent they run to
        their end: ``orchestrator.remote.run_steps``)."""
        where = self.host.name
        if run_id is None:
            return Interrupted(f"no run was started on {where}")
        look = f"`dfo status --host {where} --run {run_id}`"
        try:
            info = self._settled(run_id)
        except (DfoError, KeyboardInterrupt):
            return Interrupted(f"run {run_id} may have started on {where}",
                               hint=f"check with {look}")
        if info is None:
            return Interrupted(f"run {run_id} was not started on {where} (nothing of it is "
                               "there)")
        shown = info.shown_status
        if shown == NEVER_STARTED:
            return Interrupted(f"run {run_id} did not start on {where}",
                               hint=f"remove {self.tree.run_dir(run_id)} (nothing of it ran)")
        if not info.state.pid and shown not in rs.FINAL:
            return Interrupted(f"run {run_id} may have started on {where} (its supervisor has "
                               "not reported yet)", hint=f"check with {look}")
        return Interrupted(f"run {run_id} started on {where} and goes on ({shown})",
                           hint=f"follow it with `dfo logs -f --host {where} --run {run_id}`; "
                           f"stop it with `dfo stop --host {where} --run {run_id}`")

    def _settled(self, run_id: str, timeout: float = 60.0) -> RunStatus | None:
        """``run_id`` as the host shows it once its launch steps are over: its supervisor
        has written its state, the run ended or never started; what is there at
        ``timeout`` (None: nothing of it)."""
        deadline = time.monotonic() + timeout
        while True:
            runs = self.status(run_id)
            info = runs[0] if runs else None
            if info is not None and (info.state.pid or info.shown_status in rs.FINAL
                                     or info.shown_status == NEVER_STARTED):
                return info
            if time.monotonic() > deadline:
                return info
            time.sleep(0.2)

    def _launch(self, o: LaunchOptions) -> lp.LaunchPlan:
        plan = self.plan(o)
        if o.dry_run:
            return plan
        if plan.lock_owner and o.replace:
            # stop first, then plan again: the checkpoint the stop saves is what
            # `--resume latest` must see
            self._stop_for_replace(plan.lock_owner, plan.spec.thresholds.stop_timeout_s)
            plan = self.plan(o)
        return self.start_planned(plan, o)

    def start_planned(self, plan: lp.LaunchPlan, o: LaunchOptions, *,
                      wait: bool = True) -> lp.LaunchPlan:
        """Write ``plan``'s run dir and spec.json and start its supervisor: ONE round trip
        (``plan.launch_steps``); with ``wait``, wait until it took run.lock
        (engine.group_runs starts every node, then waits)."""
        self._launching = plan.run_id
        steps = ls.launch_steps(plan, self.tree.locks)
        r = self.transport.run(ls.steps_argv(self.python), stdin=ls.steps_stdin(steps),
                       timeout=ls.steps_timeout(steps))
        reply = ls.parse_reply(r.out)
        if reply is None:
            r.check(f"starting run {plan.run_id}")
            raise RemoteCommandError(f"starting run {plan.run_id}: the host gave no answer",
                                     hint="see `dfo status`")
        if reply.is_failure:
            raise self._step_error(plan, steps, reply)
        if wait:
            self.wait_started(plan.run_id, o.start_timeout)
        return plan

    def _step_error(self, plan: lp.LaunchPlan, steps: list[RunStep | WriteStep],
                    reply: StepsReply) -> DfoError:
        sid = reply.failed
        ck = plan.spec.resume.checkpoint_dir
        if sid == "run_dir":   # exclusive: never share a run's directory
            return LockHeldError(f"run directory {plan.run_dir} already exists (another launch "
                                 "made it)", hint="launch again: it gets a new run id")
        if sid == "moved":
            return LockHeldError(f"{ck} could not be moved to {plan.move_aside} (it exists)",
                                 hint="launch again")
        argv = next((s.run for s in steps if isinstance(s, RunStep) and s.id == sid), [])
        res = Result(tuple(argv), int(reply.exit_code or 1), reply.stdout.encode(),
                     reply.stderr.encode())
        try:
            res.check(ls.WHAT.get(str(sid), f"launch step {sid}"))
        except DfoError as e:
            return e
        return RemoteCommandError(f"launch step {sid} failed")

    def _stop_for_replace(self, owner: str, stop_timeout_s: float) -> None:
        self.say(f"stopping run {owner} (--replace)")
        self.stop(owner, timeout=stop_timeout_s + 30)
        deadline = time.monotonic() + 30
        while self.probe().held:
            if time.monotonic() > deadline:
                raise LockHeldError(f"run {owner} still holds run.lock after stopping",
                                    hint="see `dfo status`; stop it with `dfo stop`")
            time.sleep(0.3)

    def wait_started(self, run_id: str, timeout: float) -> RunStatus:
        """Until the supervisor of ``run_id`` runs (or ended); RunFailed when it does not
        within ``timeout``."""
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            self._wait_lock_taken(run_id, min(deadline, time.monotonic() + 1.5))
            runs = self.status(run_id)
            if runs:
                last = runs[0]
                st = last.state.status
                if st == "failed":
                    self._lost_the_lock(run_id, last)
                    raise RunFailed(f"run {run_id} failed at start: {last.state.reason}")
                if st in rs.FINAL or (st in rs.LIVE and st != "starting" and last.live):
                    return last
                if last.shown_status in (LOST, NEVER_STARTED):
                    raise self._died_at_start(run_id, last)
            time.sleep(0.3)
        log_tail = self._tail(posixpath.join(self.tree.run_dir(run_id), rs.SUPERVISOR_LOG))
        raise RunFailed(f"the supervisor of {run_id} did not start within {timeout:.0f}s"
                        + (f": {log_tail}" if log_tail else ""),
                        hint=f"see {self.tree.run_dir(run_id)}/supervisor.log")

    def _died_at_start(self, run_id: str, info: RunStatus) -> RunFailed:
        """The supervisor of ``run_id`` exited before its run took off: its own last line."""
        log_path = posixpath.join(self.tree.run_dir(run_id), rs.SUPERVISOR_LOG)
        log_tail = self._tail(log_path, skip="dfo: supervisor exited")   # the restart loop's
        return RunFailed(f"the supervisor of {run_id} exited at start"
                         + (f": {log_tail}" if log_tail else " (it wrote nothing)"),
                         hint=f"see {log_path}; fix it, then `dfo launch` again")

    def _wait_lock_taken(self, run_id: str, until: float) -> None:
        """Until the supervisor of ``run_id`` holds run.lock (it is "running" a moment
        later), or ``until``: one launch probe that waits inside the container."""
        secs = math.ceil(until - time.monotonic())
        if secs > 0:
            p = launch_probe(self.tree.root, self.tree.run_lock, owner=run_id, wait_s=secs)
            self.transport.run(list(p.argv), timeout=60 + secs).check(f"probing {self.host.name}")

    def _lost_the_lock(self, run_id: str, info: RunStatus) -> None:
        """A supervisor that ends ``failed`` at once while run.lock is held by another run
        lost the race for it (two launches at the same moment): that is exit 9, not 10."""
        probe = self.probe()
        owner = probe.lock_owner
        if probe.held and owner and owner != run_id:
            raise LockHeldError(f"run {owner} is live on {self.host.name} (run.lock held); "
                                f"run {run_id} did not start ({info.state.reason})",
                                hint=f"stop it with `dfo stop --run {owner}` or launch --replace")

    def _tail(self, path: str, skip: str | None = None) -> str:
        """The last line of ``path`` on the host (those starting with ``skip`` left out)."""
        try:
            text = self.transport.get(path).decode("utf-8", "replace")
        except DfoError:
            return ""
        lines = [ln for ln in text.strip().splitlines()
                 if ln.strip() and not (skip and ln.startswith(skip))]
        return lines[-1].strip() if lines else ""
