"""Reading and stopping runs on a host: ``dfo status``, ``dfo stop``, and which run a
command means (``--run``, else the live run, else the newest). ``RunQueries`` is given the
host's transport, its tree (the env's python, the root), its name and what a missing
env's hint tells to run; ``RunOps`` holds one.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

from dfo_contract.status import QueryReply, RunStatus

from ..common.errors import ConfigError, DeployError, NotFoundError, RunFailed
from ..plan.probes import query_probe, stop_probe


@dataclass(frozen=True)
class StopOutcome:
    """What ``dfo stop`` did to one run: the run as it is afterwards, and
    ``nothing_to_stop`` when it had no live supervisor (nothing was sent). Its JSON is the
    run's (``RunStatus.to_json``) with ``"nothing_to_stop": true`` in that case."""

    run: RunStatus
    nothing_to_stop: bool = False

    def to_json(self) -> dict:
        out = self.run.to_json()
        if self.nothing_to_stop:
            out["nothing_to_stop"] = True
        return out


class RunQueries:
    def __init__(self, transport, tree, host_name: str, *, deploy_with: str):
        self.transport = transport
        self.tree = tree
        self.host_name = host_name
        #: what a missing env's hint tells to run (a group member: ``--group NAME``)
        self.deploy_with = deploy_with

    @property
    def python(self) -> str:
        return self.tree.current_python

    def query(self, run: str | None = None) -> QueryReply:
        p = query_probe(self.python, self.tree.root, run)
        r = self.transport.run(list(p.argv), timeout=60)
        if not r.ok and r.exit_code in (126, 127):
            raise DeployError(f"no deployed env on {self.host_name} ({self.python} missing)",
                              hint=f"run `dfo deploy {self.deploy_with}` first")
        r.check("reading run state")
        return p.parse(r)

    def status(self, run: str | None = None) -> list[RunStatus]:
        if run is not None:
            _check_run_id(run)
        return list(self.query(run).runs)

    def current_run(self, run: str | None = None) -> str:
        """``run`` or the live run (run.lock owner), else the newest run."""
        if run:
            _check_run_id(run)
            return run
        q = self.query()
        if not q.runs:
            raise NotFoundError(f"no runs on {self.host_name}", hint="start one with `dfo launch`")
        live = [r for r in q.runs if r.live]
        if q.lock_owner and any(r.run_id == q.lock_owner for r in live):
            return q.lock_owner
        return max(live or q.runs, key=lambda r: r.state.started_at or 0).run_id

    def stop(self, run: str | None = None, *, timeout: float = 180.0,
             wait: bool = True) -> StopOutcome:
        run_id = self.current_run(run)
        p = stop_probe(self.python, self.tree.root, run_id)
        r = self.transport.run(list(p.argv), timeout=60)
        r.check("stopping the run")
        if not p.parse(r).stopped:
            runs = self.status(run_id)
            if not runs:
                raise NotFoundError(f"no run {run_id} on {self.host_name}")
            return StopOutcome(runs[0], nothing_to_stop=True)   # no live supervisor: nothing sent
        if not wait:
            return StopOutcome(self.one(run_id))
        deadline = time.monotonic() + timeout
        while True:
            info = self.one(run_id)
            if info.state.final or not info.live:
                return StopOutcome(info)
            left = deadline - time.monotonic()
            if left <= 0:
                break
            time.sleep(min(0.5, left))
        raise RunFailed(f"run {run_id} did not stop within {timeout:g}s (it is stopping: "
                        f"{info.shown_status})",
                        hint="see its supervisor.log; the supervisor kills the trainer after "
                             "stop_timeout_s")

    def one(self, run_id: str) -> RunStatus:
        """The status of run ``run_id`` (NotFoundError when it has none)."""
        runs = self.status(run_id)
        if not runs:
            have = sorted(str(r.run_id) for r in self.status(None))
            raise NotFoundError(f"no run {run_id} on {self.host_name}",
                                hint=("runs: " + ", ".join(have[-10:])) if have
                                else "there are no runs; start one with `dfo launch`")
        return runs[0]


_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,79}$")


def _check_run_id(run: str) -> None:
    if not _RUN_ID.match(run or ""):
        raise ConfigError(f"--run {run!r} is not a run id", hint="see `dfo status` for run ids")
