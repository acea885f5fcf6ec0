"""The changes ``dfo deploy`` makes to ``<root>/envs/`` itself (``EnvSwitch``, held by
``Deployer``): the atomic switch of ``envs/current`` under run.lock, which also retires
older generations of the env, and the removal of half-built envs; the free space a new env
needs, counting what dfo removes first or reuses (``plan.deploy_space``). It is given the
transport, the tree, the host's name, the deploy's stage clock and lease, the free space
the profile asks for, and ``run``: the deploy's runner of a locked command
(``DeployRunner.run``: lost lease and run.lock errors said as a deploy says them)."""

from __future__ import annotations

import posixpath
from typing import Callable

from ..common.errors import DeployError, LockHeldError
from ..plan import deploy_plan as dp
from ..plan import deploy_space as ds

#: the switch itself is instant; deleting the envs it retires (renamed first) takes longer
SWITCH_TIMEOUT = 600.0


class EnvSwitch:
    def __init__(self, transport, tree, host_name: str, *, clock, lease,
                 run: Callable[..., str], min_free_mb: int):
        self.transport = transport
        self.tree = tree
        self.host_name = host_name
        self.clock = clock
        self.lease = lease
        self.run = run
        self.min_free_mb = min_free_mb

    def switch(self, new: str, new_previous: str, retire: list[str] | None = None) -> None:
        t = self.clock.begin("switch", new)
        argv = self.lease.locked(dp.script_argv(dp.SWITCH_SCRIPT, self.tree.envs, new, new_previous,
                                                self.tree.run_lock, *(retire or []),
                                                name="dfo-switch"))
        r = self.transport.run(argv, timeout=SWITCH_TIMEOUT)
        if r.exit_code == dp.EXIT_BUSY:
            owner = next((ln.split("\t", 1)[1] for ln in r.out.splitlines()
                          if ln.startswith("@runlock\t")), None)
            if owner is not None:
                self.clock.end("switch", t, "refused: run.lock held", status="failed")
                raise dp.run_lock_error(self.host_name, self.tree.root, dp.decode_b64(owner))
        if "@switched" not in r.out:
            self.clock.end("switch", t, "failed", status="failed")
            r.check("switching envs/current")
        gone = [ln.split("\t", 1)[1] for ln in r.out.splitlines() if ln.startswith("@retired\t")]
        self.clock.end("switch", t, f"envs/current -> {new}"
                       + (f"; removed {', '.join(gone)}" if gone else ""))

    def guard_run_lock(self, state: dp.RemoteState) -> None:
        if state.run_lock_held:
            raise dp.run_lock_error(self.host_name, self.tree.root, state.run_lock_owner)

    def check_space(self, state: dp.RemoteState, clean: list[str]) -> None:
        """DeployError when the target has no room for the new env. ``df`` first; only when
        that looks short, what dfo's own leftovers hold (half-built envs, removed before the
        build: ``clean``; uv's cache, reused) is measured and counted too."""
        need, root = self.min_free_mb, self.tree.root
        if dp.check_disk(state.df_kb, need, host=self.host_name, root=root) is None:
            return
        r = self.transport.run(dp.script_argv(ds.RECLAIM_SCRIPT, root, *clean, name="dfo-reclaim"),
                       timeout=600)
        found = ds.parse_reclaim(r)
        msg = ds.check_space(state.df_kb, need, found if found.complete_output
                             else ds.Reclaimable(), host=self.host_name, root=root)
        if msg:
            raise DeployError(msg, hint="free space on the target; envs/current is untouched")

    def clean(self, names: list[str]) -> None:
        paths = [posixpath.join(self.tree.envs, n) for n in names]
        self.run(dp.script_argv(dp.CLEAN_SCRIPT, *paths, name="dfo-clean"),
                 what="removing half-built envs")

    def clean_alone(self, state: dp.RemoteState, names: list[str]) -> bool:
        """A no-op deploy removes half-built envs under the lease; while another deploy
        holds it, the env may be that deploy's: left alone."""
        try:
            self.lease.acquire(state)
        except LockHeldError:
            return False
        try:
            self.clean(names)
        finally:
            self.lease.release()
        return True
