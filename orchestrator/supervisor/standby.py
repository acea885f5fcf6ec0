"""The supervisor's standby interpreter (docs/recovery.md, "Standby interpreter").

Once attempt n reached training, :class:`Keeper` starts one ``shim --standby`` process with
attempt n+1's environment; it imports what the trainer needs and reports ready. When the
supervisor starts attempt n+1 it asks :meth:`Keeper.take`: a ready standby whose python and
import-time environment match (``supervisor.policy.standby.decide``) gets the attempt (one JSON line on its
stdin) and its Popen is the attempt's process; otherwise it is killed and the attempt starts
fresh. At most one standby lives; it is killed when the run ends and dies with the
supervisor (PR_SET_PDEATHSIG). Its pid is ``state.json``'s ``standby_pid``.

The keeper is given what it needs (:class:`KeeperInputs`), never the supervisor: the
standby's spec, the thresholds, the config and attempt env of the source, the run's
events, and whether the source and the role allow a standby at all.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from dfo_contract import events
from dfo_contract.runlimits import Thresholds
from dfo_contract.runspec import Bundled, Standby as StandbySpec
from dfo_contract.runstate import attempt_log_name
from dfo_contract.trainer_config import TrainerConfig

from .policy import standby as standby_ops
from . import procs

LOG_NAME = "standby.log"


@dataclass(frozen=True)
class KeeperInputs:
    run_dir: str
    python: str                                   # the deployed env's interpreter
    spec: StandbySpec                             # on/off, the env given to the standby only
    thresholds: Thresholds                        # standby_wait_s, standby_early_cpus
    config: Callable[[], TrainerConfig | None]    # the typed config in force (bundled trainer)
    bundled: Callable[[], Bundled | None]         # its layout in force (spec.json's trainer)
    attempt_env: Callable[[int], dict[str, str]]  # attempt n's env (the source's)
    emit: Callable[[events.Event], Any]
    #: the run's record of its standby (state.json's ``standby_pid``): one started for
    #: attempt n as pid (saved); the one there gone, as the event says
    started: Callable[[int, int], None]
    gone: Callable[[events.Event], None]
    own: bool = False     # the source is an own command (only the bundled trainer preloads)
    group: bool = False   # the role is one node of several (torchrun)


class Keeper:
    def __init__(self, inputs: KeeperInputs):
        self.i = inputs
        self.proc: subprocess.Popen | None = None
        self.info: standby_ops.StandbyProcess | None = None
        self._ready_fd: int | None = None
        self._buf = b""
        self._for: int | None = None     # the attempt the last standby was started for

    # --- what the supervisor asks -----------------------------------------------------------
    def enabled(self) -> bool:
        i = self.i
        return i.spec.enabled and not i.own and not i.group

    def pids(self) -> list[int]:
        """The standby and its children (never killed as an attempt's leftovers)."""
        if self.proc is None or self.proc.poll() is not None:
            return []
        return procs.descendants(self.proc.pid) or [self.proc.pid]

    def early(self) -> bool:
        """Start the standby with the attempt (supervisor.policy.standby.start_with_attempt)."""
        cpus: int | None
        try:
            cpus = len(os.sched_getaffinity(0))  # an LXC cpuset limits this, not os.cpu_count()
        except (AttributeError, OSError):
            cpus = os.cpu_count()
        return standby_ops.start_with_attempt(cpus, float(self.i.thresholds.standby_early_cpus))

    def on_train(self, n: int) -> None:
        """Attempt n reached training: start the standby for attempt n+1 (once)."""
        if self.proc is not None or self._for == n + 1 or not self.enabled():
            return
        self._for = n + 1                # one try per attempt, even when it cannot start
        i = self.i
        cfg, part = i.config(), i.bundled()
        if cfg is None or part is None or part.layout not in standby_ops.LAYOUTS:
            return
        env = i.attempt_env(n + 1)
        env.update(i.spec.env)
        python = i.python
        r, w = os.pipe()
        os.set_blocking(r, False)
        try:
            with open(os.path.join(i.run_dir, LOG_NAME), "ab") as logf:
                self.proc = subprocess.Popen(
                    standby_ops.standby_argv(python, w, standby_ops.preload_for(cfg)),
                    stdin=subprocess.PIPE,
                    stdout=logf, stderr=logf, env=env, cwd=i.run_dir,
                    start_new_session=True, preexec_fn=procs.set_pdeathsig, pass_fds=(w,))
        except OSError as e:
            os.close(r)
            i.emit(events.StandbyDiscarded(attempt=n + 1, reason=f"could not start: {e}"))
            return
        finally:
            os.close(w)
        self._ready_fd, self._buf = r, b""
        self.info = standby_ops.StandbyProcess(pid=self.proc.pid, python=python, env=env,
                                started_at=time.time(), env_dir=_env_dir(python))
        i.started(n + 1, self.proc.pid)

    def importing(self) -> bool:
        """A standby is alive and still importing (supervisor.policy.standby.importing)."""
        return standby_ops.importing(self.info, time.time())

    def poll(self) -> None:
        """Read the ready line when it came; notice a standby that died."""
        if self.info is None or self.proc is None:
            return
        if self._ready_fd is not None:
            try:
                chunk = os.read(self._ready_fd, 65536)
            except BlockingIOError:
                chunk = None
            if chunk:
                self._buf += chunk
            if b"\n" in self._buf:
                os.close(self._ready_fd)
                self._ready_fd = None
                try:
                    rd = standby_ops.Ready.from_line(self._buf.split(b"\n", 1)[0])
                except (ValueError, KeyError) as e:
                    rd = standby_ops.Ready(0.0, error=f"unreadable ready line: {e}")
                self.info.ready, self.info.import_s = True, rd.import_s
                self.i.emit(events.StandbyReady(pid=self.proc.pid, import_s=rd.import_s,
                                                modules=len(rd.modules), niced=rd.niced,
                                                error=rd.error))
        if self.info.alive and self.proc.poll() is not None:
            self.info.alive = False

    def take(self, n: int, argv: list[str], env: Mapping[str, str], cwd: str,
             log_path: str) -> subprocess.Popen | None:
        """The standby as attempt n's process, or None (start fresh; a standby that cannot
        serve is killed, with a ``standby_discarded`` event)."""
        if self.proc is None or self.info is None:
            return None
        i = self.i
        wait = float(i.thresholds.standby_wait_s)
        end = time.monotonic() + wait
        self.poll()
        while wait > 0 and not self.info.ready and self.info.alive and time.monotonic() < end:
            time.sleep(0.1)
            self.poll()
        why_not = standby_ops.ineligible(argv, own=i.own, group=i.group,
                                 layout=None if (part := i.bundled()) is None else part.layout)
        python = i.python
        d = standby_ops.decide(self.info, python=python, env=env, argv=argv,
                       why_not=why_not, env_dir=_env_dir(python))
        if not d.use:
            self.discard(d.reason, attempt=n)
            return None
        proc, info = self.proc, self.info
        req = standby_ops.Request(list(argv), dict(env), cwd, log_path)
        try:
            assert proc.stdin is not None
            proc.stdin.write(req.to_line())
            proc.stdin.close()
        except OSError as e:
            self.discard(f"it did not take the attempt: {e}", attempt=n)
            return None
        self.proc = self.info = None
        i.gone(events.StandbyUsed(attempt=n, pid=proc.pid, import_s=info.import_s,
                                  age_s=round(time.time() - info.started_at, 3),
                                  log=attempt_log_name(n)))
        return proc

    def discard(self, reason: str, *, attempt: int | None = None) -> None:
        """Kill the standby (and its children); an event says why."""
        proc = self.proc
        if proc is None:
            return
        pids = self.pids()
        procs.signal_all(pids or [proc.pid], signal.SIGKILL)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        procs.wait_gone(pids, 5)
        if proc.stdin is not None:
            try:
                proc.stdin.close()
            except OSError:
                pass
        if self._ready_fd is not None:
            os.close(self._ready_fd)
            self._ready_fd = None
        self.proc = self.info = None
        self.i.gone(events.StandbyDiscarded(attempt=attempt, pid=proc.pid, reason=reason))


def _env_dir(python: str) -> str:
    """The venv's bin dir with symlinks resolved (``envs/current`` -> the generation): the
    interpreter file itself links to the base Python, so resolve its directory."""
    return os.path.realpath(os.path.dirname(python))
