"""One run across the nodes of a ``hosts.yaml`` group: ``dfo launch/status/stop --group``.

``GroupRuns.plan`` asks every member for its launch facts in parallel (one round trip each,
with ``RunOps``' own checks: reachable, env deployed and clean, run.lock free, config paths
present), compares the members' env fingerprints from those facts
(plan.group_check.env_differences), and plans each node with ``plan.launch_plan.plan_launch``
as a ``Group`` role: the same run id everywhere, ``--resume`` resolved on the head only
(checkpoints live there), the ddp layout forced. ``launch`` writes and starts the head
first, then the others, and waits until each took its run.lock; when one fails to start,
the started ones are stopped and the error names the node. Exit codes: the first failing
node's (engine.group.worst_exit).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from dfo_contract.codec import encode

from ..common.errors import ConfigError, DeployError, DfoError, NotFoundError
from ..plan import group_check as gc
from ..plan import group_launch as gl
from ..plan import launch_plan as lp
from ..common.group import GroupSpec
from ..plan.launch_inputs import check_run_name
from ..plan.run_identity import make_run_id
from .group import HostOutcome, for_each_host, worst_exit
from .runs import LaunchOptions, RunOps, load_trainer

log = logging.getLogger("dfo")


@dataclass
class NodePlan:
    index: int
    host: str
    plan: lp.LaunchPlan
    group: GroupSpec

    @property
    def attempt_argv(self) -> list[str]:
        return self.plan.first_attempt_argv

    def to_json(self) -> dict:
        d = self.plan.to_json()
        d.update({"node": self.index, "group": encode(self.group)})
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

    def run_ops(self, name: str) -> RunOps:
        """The RunOps of member ``name`` (its transport is opened on first use, in the
        calling thread, so one unreachable member does not stop the others)."""
        if name not in self._ops:
            i = self.group.hosts.index(name)
            self._ops[name] = RunOps(self.transport_for(name), self.hosts[i], say=self.say,
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
        if o.own:
            raise ConfigError("--group runs the bundled trainer only",
                              hint="launch your own trainer with --host")
        if o.fault_node is not None and o.fault_node >= len(self.hosts):
            raise ConfigError(f"--fault-node {o.fault_node}: group {self.group.name} has "
                              f"{len(self.hosts)} nodes",
                              hint=f"give 0..{len(self.hosts) - 1}")
        if o.replace:
            raise ConfigError("--replace cannot be combined with --group",
                              hint=f"stop the live run with `dfo stop --group {self.group.name}`")
        from ..config.runconfig import DEFAULT_RUN_NAME

        stem = Path(o.config).stem if o.config else DEFAULT_RUN_NAME
        run_name = check_run_name(stem if o.run_name is None else o.run_name)
        now = self.clock()
        run_id = o.run_id or make_run_id(run_name, now)
        base = dataclasses.replace(o, sets=tuple(gl.group_sets(o.sets)), run_name=run_name,
                                   run_id=run_id)

        # --config is parsed once for every node (the default config is each host's own)
        shared = load_trainer(base, self.hosts[0].tree) if o.config else None

        def facts(h):   # each member: its checks, its facts (one round trip)
            opts = base if self.index(h.name) == 0 else \
                dataclasses.replace(base, resume=None, new_lineage=False)
            run_ops = self.run_ops(h.name)
            inp = run_ops.prepare(opts, shared)
            return opts, inp, run_ops.facts(opts, inp)

        outs = self.each(facts)
        self.raise_failed(outs, f"cannot launch on group {self.group.name}")
        got = [x.value for x in outs if x.value is not None]  # raise_failed: each has its facts
        nodes, warnings, bad = [], [], []
        head_resume = None       # the head resolves --resume; the others take its choice
        for i, ((opts, inp, f), gs) in enumerate(zip(got, self.specs, strict=True)):
            try:
                p = lp.plan_launch(opts, inp, f, host=self.hosts[i], role=gs,
                                   resolved=None if i == 0 else head_resume)
            except DfoError as e:   # every node's problem, each named (as in the facts)
                bad.append((i, self.hosts[i].name, str(e), e.exit_code))
                continue
            if i == 0:
                head_resume = p.resume
            nodes.append(NodePlan(i, p.host, p, gs))
            warnings += [f"{p.host}: {w}" for w in p.warnings]
        if bad:
            raise gl.nodes_error(bad, f"cannot launch on group {self.group.name}")
        fps = {x.host: x.value[2].fingerprint for x in outs if x.value is not None}
        if o.env_check or any(fp is not None for fp in fps.values()):
            # --no-env-check on envs dfo did not deploy (no fingerprint.json): nothing to compare
            diffs = gc.env_differences(self.group.name, list(self.group.hosts), fps)
            if diffs:
                raise DeployError(str(diffs[0]))
        return GroupPlan(self.group.name, run_id, nodes, warnings)

    def launch(self, o: LaunchOptions) -> GroupPlan:
        gp = self.plan(o)
        if o.dry_run:
            return gp
        started: list[Any] = []
        by_name = {h.name: h for h in self.hosts}

        def start(h):
            n = gp.nodes[self.index(h.name)]
            self.run_ops(h.name).start_planned(n.plan, o, wait=False)
            started.append(h)

        try:
            first = self.each(start, self.hosts[:1])          # the head's run dir first
            outs = first if not first[0].ok else first + self.each(start, self.hosts[1:])
            self.raise_failed(outs, f"run {gp.run_id} did not start")
            waits = self.each(lambda h: self.run_ops(h.name).wait_started(gp.run_id, o.start_timeout))
            self.raise_failed(waits, f"run {gp.run_id} did not start")
        except DfoError:
            if started:
                names = ", ".join(h.name for h in started)
                self.say(f"stopping run {gp.run_id} on {names} (the group did not start)")
                order = [by_name[n] for n in self.group.hosts if by_name[n] in started]
                stop_s = gp.head.plan.spec.thresholds.stop_timeout_s + 30
                self.each(lambda h: self._stop_started(h.name, gp.run_id, o.start_timeout, stop_s),
                          order)
            raise
        return gp

    def _stop_started(self, name: str, run_id: str, start_timeout: float, stop_s: float) -> None:
        """Stop a node's supervisor that was started for a group that did not start: once it
        runs (a supervisor still starting has no stop handler yet)."""
        run_ops = self.run_ops(name)
        try:
            run_ops.wait_started(run_id, start_timeout)
        except DfoError:
            pass
        run_ops.stop(run_id, timeout=stop_s)

    # --- status / stop ---------------------------------------------------------------------
    def resolve_run(self, run: str | None) -> str:
        """``run``, else the head's live run, else its newest."""
        return self.run_ops(self.group.head).current_run(run)

    def status(self, run: str | None = None) -> tuple[str, list[HostOutcome]]:
        run_id = self.resolve_run(run)

        def one(h):
            runs = self.run_ops(h.name).status(run_id)
            if not runs:
                raise NotFoundError(f"no run {run_id} on {h.name}")
            return runs[0]

        return run_id, self.each(one)

    def stop(self, run: str | None = None, *, timeout: float = 300.0
             ) -> tuple[str, list[HostOutcome]]:
        run_id = self.resolve_run(run)
        return run_id, self.each(lambda h: self.run_ops(h.name).stop(run_id, timeout=timeout))


def exit_code(outcomes: Sequence[HostOutcome]) -> int:
    return worst_exit(outcomes)
