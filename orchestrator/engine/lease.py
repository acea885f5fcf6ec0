"""The deploy lease: ``flock`` on ``locks/deploy.lock`` held by a small owner record
(user, machine, pid and the process's start time, start) under a token; a killed deploy's
lease is taken over (its process is gone on this machine: no process with that pid and
start time, so a reused pid does not keep it; or the lease went stale), a live one is
refused."""

from __future__ import annotations

import datetime as _dt
import getpass
import logging
import os
import posixpath
import socket
import uuid
from typing import Callable

from dfo_contract.procs import alive, process_start, same_process
from dfo_contract.replies import LeaseHolder

from ..common.errors import DeployError, LockHeldError, RemoteCommandError
from ..plan import deploy_plan as dp
from ..config.host_tree import HostTree

log = logging.getLogger("dfo")

TAKEOVER_WAIT_S = 900  # wait this long for a killed deploy's orphaned command to end


class DeployLease:
    def __init__(self, transport, tree: HostTree, host_name: str,
                 say: Callable[[str], None] = lambda msg: None):
        self.transport = transport
        self.tree = tree
        self.host_name = host_name
        self.say = say
        self.token = uuid.uuid4().hex
        self.held = False

    @property
    def owner_file(self) -> str:
        return posixpath.join(self.tree.locks, "deploy.owner")

    def locked(self, argv: list[str]) -> list[str]:
        """``argv`` run under the deploy lock, only while this lease owns it."""
        return dp.locked_argv(self.tree.deploy_lock, self.owner_file, self.token, argv)

    def acquire(self, state: dp.RemoteState) -> None:
        takeover, wait = "", 10
        if state.deploy_owner:
            tok, info = dp.lease_owner(state.deploy_owner)
            same_machine = info.machine == socket.gethostname()
            dead = same_machine and info.pid is not None and not _holder_alive(info)
            stale = (state.deploy_owner_age or 0) >= dp.LEASE_STALE_S
            if dead or stale:
                takeover, wait = tok, TAKEOVER_WAIT_S
                self.say(f"taking over the lock of a {'killed' if dead else 'stale'} deploy "
                         f"(waiting for its last command to end)")
            else:
                raise LockHeldError(
                    f"{dp.describe_lease(state.deploy_owner)} holds "
                    f"{self.tree.deploy_lock} on {self.host_name}",
                    hint=f"wait for it to finish; a killed deploy's lock frees itself after "
                         f"{dp.LEASE_STALE_S} s")
        holder = LeaseHolder(user=getpass.getuser(), machine=socket.gethostname(),
                             pid=os.getpid(), pid_start=process_start(os.getpid()),
                             started=_dt.datetime.now().isoformat(timespec="seconds")).to_text()
        argv = dp.script_argv(dp.LEASE_SCRIPT, self.tree.deploy_lock, self.owner_file,
                              self.token, holder, str(dp.LEASE_STALE_S), takeover or "-",
                              str(wait), name="dfo-lease")
        r = self.transport.run(argv, timeout=wait + 60)
        if "@acquired" in r.out:
            self.held = True
            return
        held = next((ln.split("\t", 1)[1] for ln in r.out.splitlines()
                     if ln.startswith(("@held\t", "@busy\t"))), "")
        if "@unwritable" in r.out:
            why = (r.err.strip().splitlines() or ["cannot be written"])[-1].rsplit(": ", 1)[-1]
            raise DeployError(f"cannot write {self.tree.deploy_lock} on {self.host_name}: "
                              f"{why}",
                              hint=f"deploy into a writable root (hosts.yaml `root:`, now "
                                   f"{self.tree.root})")
        if r.exit_code == dp.EXIT_BUSY:
            who = dp.describe_lease(held) if held else "another deploy"
            raise LockHeldError(f"{who} holds {self.tree.deploy_lock} on {self.host_name}",
                                hint="wait for it to finish, then deploy again")
        raise RemoteCommandError(f"cannot take {self.tree.deploy_lock} on {self.host_name}: "
                                 f"{(r.err.strip().splitlines() or ['no output'])[-1]}")

    def release(self) -> None:
        if not self.held:
            return
        self.held = False
        try:
            self.transport.run(dp.script_argv(dp.RELEASE_SCRIPT, self.tree.deploy_lock, self.owner_file,
                                      self.token, name="dfo-release"), timeout=30)
        except Exception:  # noqa: BLE001 - the lease goes stale by itself
            log.debug("releasing the deploy lease failed", exc_info=True)


def _holder_alive(info: LeaseHolder) -> bool:
    """The lease holder's process (on this machine) still runs: its pid with the recorded
    start time; a lease that records no start time (an older dfo's) by its pid alone."""
    if info.pid is None:
        return False
    if info.pid_start is not None:
        return same_process(info.pid, info.pid_start)
    return alive(info.pid)
