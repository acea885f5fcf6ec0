"""One run across the nodes of a ``hosts.yaml`` group: ``dfo launch/status/stop --group``.

``GroupRuns.plan`` plans the run on every member in parallel with ``RunOps.plan``'s own
checks (reachable, env deployed and clean, run.lock free, config paths present), compares
the members' env fingerprints (ops.group_check.env_differences), resolves ``--resume`` on
the head only (checkpoints live there), gives every node the same run id and its
``GroupSpec`` (the ``group`` section of its spec.json) and forces the ddp layout.
``launch`` writes the head's run dir first, then the others', starts every supervisor and
waits until each took its run.lock; when one fails to start, the started ones are stopped
and the error names the node. Exit codes: the first failing node's (engine.group.worst_exit).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import posixpath
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from ..errors import ConfigError, DeployError, DfoError, NotFoundError
from ..ops import group_check as gc
from ..ops import group_launch as gl
from ..ops import launch_plan as lp
from ..ops.deploy_plan import FINGERPRINT_FILE
from ..ops.group import GroupSpec
from .group import HostOutcome, for_each_host, worst_exit
from .runs import LaunchOptions, RunOps

log = logging.getLogger("dfo")


class _PeerOps(RunOps):
    """A non-head node: it has no checkpoints of its own to guard (the head holds them)."""

    def _lineage_check(self, ck_dir, run_name, now, new_lineage):
        return None


@dataclass
class NodePlan:
    index: int
    host: str
    plan: lp.LaunchPlan
    group: GroupSpec
    attempt_argv: list[str]

    def to_json(self) -> dict:
        d = self.plan.to_json()
        d.update({"node": self.index, "group": self.group.to_json(),
                  "first_attempt_argv": self.attempt_argv})
        return d


@dataclass
class GroupPlan:
    group: str
    run_id: str
    nodes: list[NodePlan]
    warnings: list[str] = field(default_factory=list)

    @property
    def head(self) -> NodePlan:
        return self.nodes[0]

    def to_json(self) -> dict:
        return {"group": self.group, "run_id": self.run_id, "warnings": self.warnings,
                "resume": self.head.plan.resume_path,
                "nodes": [n.to_json() for n in self.nodes]}


class GroupRuns:
    def __init__(self, group, hosts: Sequence[Any], transport_for: Callable[[str], Any], *,
                 say: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.time):
        self.group = group
        self.hosts = list(hosts)
        self.transport_for = transport_for
        self.say = say or (lambda m: log.info("%s", m))
        self.clock = clock
        self.specs = gl.group_specs(group, self.hosts)
        self._ops: dict[str, RunOps] = {}

    def ops(self, name: str) -> RunOps:
        """The RunOps of member ``name`` (its transport is opened on first use, in the
        calling thread, so one unreachable member does not stop the others)."""
        if name not in self._ops:
            i = self.group.hosts.index(name)
            cls = RunOps if i == 0 else _PeerOps
            self._ops[name] = cls(self.transport_for(name), self.hosts[i], say=self.say,
                                  clock=self.clock, deploy_with=f"--group {self.group.name}")
        return self._ops[name]

    def index(self, name: str) -> int:
        return self.group.hosts.index(name)

    def each(self, fn: Callable[[Any], Any], hosts: Sequence[Any] | None = None
             ) -> list[HostOutcome]:
        return for_each_host(self.hosts if hosts is None else hosts, fn)

    def raise_failed(self, outcomes: Sequence[HostOutcome], what: str) -> None:
        bad = [(self.index(o.host), o.host, o.error or "", o.exit_code)
               for o in outcomes if not o.ok]
        if bad:
            raise gl.nodes_error(bad, what)

    # --- launch ----------------------------------------------------------------------------
    def plan(self, o: LaunchOptions) -> GroupPlan:
        if o.command or o.run_file or o.resume_glob or o.ladder:
            raise ConfigError("--group runs the bundled trainer only",
                              hint="launch your own trainer with --host")
        if o.fault_node is not None and o.fault_node >= len(self.hosts):
            raise ConfigError(f"--fault-node {o.fault_node}: group {self.group.name} has "
                              f"{len(self.hosts)} nodes",
                              hint=f"give 0..{len(self.hosts) - 1}")
        if o.replace:
            raise ConfigError("--replace cannot be combined with --group",
                              hint=f"stop the live run with `dfo stop --group {self.group.name}`")
        sets = gl.group_sets(o.sets)
        from ..config.runconfig import default_config_path

        cfg = o.config or default_config_path()
        run_name = lp.check_run_name(Path(cfg).stem if o.run_name is None else o.run_name)
        now = self.clock()
        run_id = o.run_id or lp.make_run_id(run_name, now)
        base = dataclasses.replace(o, sets=tuple(sets), run_name=run_name, run_id=run_id,
                                   dry_run=True)

        def one(h):
            i = self.index(h.name)
            opts = base if i == 0 else dataclasses.replace(base, resume=None, new_lineage=False)
            if o.fault_node is not None and i != o.fault_node:
                opts = dataclasses.replace(opts, fault=None)
            ops = self.ops(h.name)
            plan = ops.plan(opts)
            return plan, self._fingerprint(ops)

        outs = self.each(one)
        self.raise_failed(outs, f"cannot launch on group {self.group.name}")
        fps = {x.host: x.value[1] for x in outs}
        if o.env_check or any(fp is not None for fp in fps.values()):
            # --no-env-check on envs dfo did not deploy (no fingerprint.json): nothing to compare
            diffs = gc.env_differences(self.group.name, list(self.group.hosts), fps)
            if diffs:
                raise DeployError(str(diffs[0]))
        plans = [x.value[0] for x in outs]
        head = plans[0]
        nodes = []
        warnings = []
        for i, (p, gs) in enumerate(zip(plans, self.specs)):
            p.spec["group"] = gs.to_json()
            p.spec["resume"] = head.resume_path        # the head's path: main rank loads it
            p.resume_path = head.resume_path
            argv = gl.node_attempt_argv(
                p.spec["python"], p.spec["config_path"], p.spec["overrides"],
                run_dir=p.run_dir, checkpoint_dir=p.spec["checkpoint_dir"],
                resume=head.resume_path, spec=gs, run_id=run_id)
            p.first_attempt_argv = argv
            nodes.append(NodePlan(i, p.host, p, gs, argv))
            warnings += [f"{p.host}: {w}" for w in p.warnings]
        return GroupPlan(self.group.name, run_id, nodes, warnings)

    def _fingerprint(self, ops: RunOps) -> dict | None:
        path = posixpath.join(ops.layout.current_env, FINGERPRINT_FILE)
        try:
            return json.loads(ops.t.get(path))
        except (DfoError, ValueError):
            return None

    def launch(self, o: LaunchOptions) -> GroupPlan:
        gp = self.plan(o)
        if o.dry_run:
            return gp
        started: list[Any] = []
        by_name = {h.name: h for h in self.hosts}

        def start(h):
            n = gp.nodes[self.index(h.name)]
            self.ops(h.name).start_planned(n.plan, o, wait=False)
            started.append(h)

        try:
            first = self.each(start, self.hosts[:1])          # the head's run dir first
            outs = first if not first[0].ok else first + self.each(start, self.hosts[1:])
            self.raise_failed(outs, f"run {gp.run_id} did not start")
            waits = self.each(lambda h: self.ops(h.name)._wait_started(gp.run_id, o.start_timeout))
            self.raise_failed(waits, f"run {gp.run_id} did not start")
        except DfoError:
            if started:
                names = ", ".join(h.name for h in started)
                self.say(f"stopping run {gp.run_id} on {names} (the group did not start)")
                order = [by_name[n] for n in self.group.hosts if by_name[n] in started]
                stop_s = gp.head.plan.spec["thresholds"]["stop_timeout_s"] + 30
                self.each(lambda h: self._stop_started(h.name, gp.run_id, o.start_timeout, stop_s),
                          order)
            raise
        return gp

    def _stop_started(self, name: str, run_id: str, start_timeout: float, stop_s: float) -> None:
        """Stop a node's supervisor that was started for a group that did not start: once it
        runs (a supervisor still starting has no stop handler yet)."""
        ops = self.ops(name)
        try:
            ops._wait_started(run_id, start_timeout)
        except DfoError:
            pass
        ops.stop(run_id, timeout=stop_s)

    # --- status / stop ---------------------------------------------------------------------
    def resolve_run(self, run: str | None) -> str:
        """``run``, else the head's live run, else its newest."""
        return self.ops(self.group.head).current_run(run)

    def status(self, run: str | None = None) -> tuple[str, list[HostOutcome]]:
        run_id = self.resolve_run(run)

        def one(h):
            runs = self.ops(h.name).status(run_id)
            if not runs:
                raise NotFoundError(f"no run {run_id} on {h.name}")
            return runs[0]

        return run_id, self.each(one)

    def stop(self, run: str | None = None, *, timeout: float = 300.0
             ) -> tuple[str, list[HostOutcome]]:
        run_id = self.resolve_run(run)
        return run_id, self.each(lambda h: self.ops(h.name).stop(run_id, timeout=timeout))


def exit_code(outcomes: Sequence[HostOutcome]) -> int:
    return worst_exit(outcomes)
