"""Reading and stopping runs on a host: ``dfo status``, ``dfo stop``, and which run a
command means (``--run``, else the live run, else the newest). ``RunQueries`` is given the
host's transport, its layout (the env's python, the root), its name and what a missing
env's hint tells to run; ``RunOps`` holds one.
"""

from __future__ import annotations

import re
import time

from dfo_contract import runstate as rs

from ..errors import ConfigError, DeployError, NotFoundError, RunFailed
from ..ops.probes import json_reply


class RunQueries:
    def __init__(self, transport, layout, host_name: str, *, deploy_with: str):
        self.t = transport
        self.layout = layout
        self.host_name = host_name
        #: what a missing env's hint tells to run (a group member: ``--group NAME``)
        self.deploy_with = deploy_with

    @property
    def python(self) -> str:
        return self.layout.current_python

    def query(self, run: str | None = None) -> dict:
        argv = [self.python, "-m", "orchestrator.supervisor.query", "--root", self.layout.root]
        if run:
            argv += ["--run", run]
        r = self.t.run(argv, timeout=60)
        if not r.ok and r.exit_code in (126, 127):
            raise DeployError(f"no deployed env on {self.host_name} ({self.python} missing)",
                              hint=f"run `dfo deploy {self.deploy_with}` first")
        r.check("reading run state")
        return json_reply(r.out, "reading run state")

    def status(self, run: str | None = None) -> list[dict]:
        if run is not None:
            _check_run_id(run)
        return self.query(run)["runs"]

    def current_run(self, run: str | None = None) -> str:
        """``run`` or the live run (run.lock owner), else the newest run."""
        if run:
            _check_run_id(run)
            return run
        q = self.query()
        runs = q["runs"]
        if not runs:
            raise NotFoundError(f"no runs on {self.host_name}", hint="start one with `dfo launch`")
        owner = q.get("lock_owner")
        live = [r for r in runs if r.get("live")]
        if owner and any(r["run_id"] == owner for r in live):
            return owner
        if live:
            return max(live, key=lambda r: r.get("started_at") or 0)["run_id"]
        return max(runs, key=lambda r: r.get("started_at") or 0)["run_id"]

    def stop(self, run: str | None = None, *, timeout: float = 180.0, wait: bool = True) -> dict:
        run_id = self.current_run(run)
        r = self.t.run([self.python, "-m", "orchestrator.supervisor.query", "--root",
                        self.layout.root, "--stop", run_id], timeout=60)
        r.check("stopping the run")
        res = json_reply(r.out, "stopping the run")
        if not res.get("stopped"):
            runs = self.status(run_id)
            if not runs:
                raise NotFoundError(f"no run {run_id} on {self.host_name}")
            return {**runs[0], "nothing_to_stop": True}   # no live supervisor: nothing sent
        if not wait:
            return self.one(run_id)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            info = self.one(run_id)
            if info.get("status") in rs.FINAL or not info.get("live"):
                return info
            time.sleep(0.5)
        raise RunFailed(f"run {run_id} did not stop within {timeout:.0f}s",
                        hint="see its supervisor.log; the supervisor kills the trainer after "
                             "stop_timeout_s")

    def one(self, run_id: str) -> dict:
        """The status of run ``run_id`` (NotFoundError when it has none)."""
        runs = self.status(run_id)
        if not runs:
            raise NotFoundError(f"no run {run_id} on {self.host_name} (its directory is gone)")
        return runs[0]


_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,79}$")


def _check_run_id(run: str) -> None:
    if not _RUN_ID.match(run or ""):
        raise ConfigError(f"--run {run!r} is not a run id", hint="see `dfo status` for run ids")
