"""One run across several nodes: this node's role (``supervisor.role``). The supervisors
coordinate through a ``torch.distributed.TCPStore`` the head's supervisor hosts on
``head_addr:coord_port`` (``supervisor.coordinator``; keys and messages:
``dfo_contract.group_store``; decisions: ``supervisor.policy.group_decide``). torchrun's c10d store
lives only as long as one attempt's torchrun; this one lives as long as the head's
supervisor (the user's laptop is not involved).

:class:`GroupHead` runs the supervisor's ordinary attempt loop (budget, fallback and
checkpoint choice happen once, there) and its hooks publish the plan of each attempt,
gather every node's end into one root cause and publish the decision. ``supervisor.group_member``'s :class:`GroupMember`
(a peer) runs its own loop: it waits for the head's plan, runs its part, reports its end
and mirrors the decision. Both run their attempts through the supervisor's steps
(``role.Driver``); what a node knows of one attempt beyond its watch (another node's abort,
the lost nodes, who aborted first) is the role's :class:`GroupAttempt`.
"""

from __future__ import annotations

import dataclasses
import signal
import subprocess
import time
from dataclasses import dataclass
from typing import Any, Callable

from dfo_contract import events
from dfo_contract.group_store import AttemptPlan, GroupVerdict, NodeOutcome
from dfo_contract.runlimits import Thresholds
from dfo_contract.runspec import Group
from dfo_contract.state_records import copied

from ..common.classify import Diagnosis
from ..common.classify_rules import NODE_LOST, PEER_ABORT
from .policy.group_decide import (caches_cleared, head_restarted_reason, head_stalled_reason,
                                lost_end, node_left_reason, node_lost_reason, on_node,
                                root_cause, run_healthy_s, run_reached_train)
from ..common.launch_argv import Rendezvous, group_env
from .policy.watchdog import AttemptWatchdog
from . import procs
from .hostprobe import local_addr
from .coordinator import STORE_POLL_S, Coordinator
from .record import RunRecord, Stop
from .role import Driver, Ending, Placement
from .watch import Outcome


@dataclass
class GroupAttempt:
    """This node's part in one attempt of the group, beyond what its watch saw
    (``Outcome``): written by the role's watch hooks, read when the attempt ends."""
    n: int
    #: another node's abort of the attempt (why), the lost nodes [(index, silent s)]
    peer_abort: str | None = None
    lost: list[tuple[int, float]] | None = None
    #: this node aborted the attempt in the store; it was the first to
    abort_set: bool = False
    origin: bool = False
    #: when to SIGKILL the attempt's tree (after a SIGTERM for another node)
    kill_at: float | None = None
    #: when the store is read next
    store_next: float = 0.0
    #: this node's stopped processes as last told to the group's store
    stopped_told: tuple[int, ...] = ()
    #: the node whose stopped processes the watchdog's ``frozen`` names (None: this node's)
    frozen_on: str | None = None
    #: the head: the nodes whose compile cache the restart clears
    #: (``supervisor.policy.group_decide.caches_cleared``)
    caches_cleared: tuple[str, ...] = ()


class GroupRole:
    """What the head and a member share: the coordinator, the stop that reaches every
    node, the watch's checks of the other nodes, the torchrun part of an attempt."""
    multinode = True

    def __init__(self, gs: Group, run_id: str, run_dir: str, kill_grace_s: float,
                 record: RunRecord, stop: Stop):
        self.gs = gs
        self.run_id = run_id
        self.run_dir = run_dir
        self.kill_grace_s = float(kill_grace_s)
        self.record = record
        self.stop = stop
        #: the connection to the group's store (None: not open, or released)
        self.coord: Coordinator | None = None
        #: the nodes found silent while waiting on the store: [(index, silent s)]
        self.lost: list[tuple[int, float]] = []
        #: this node's part in the attempt under way (or the last one)
        self.current: GroupAttempt | None = None

    # --- the run's start and end ------------------------------------------------------------
    def open(self) -> None:
        gs, c = self.gs, Coordinator(self.gs, self.run_id)
        c.open()
        self.coord = c
        self.record.emit(events.GroupStart(node=gs.node, host=gs.host, nodes=list(gs.nodes),
                                           head_addr=gs.head_addr, coord_port=gs.coord_port))

    def restarted(self, attempt: int, abandoned: bool) -> str | None:
        return None

    def release(self) -> None:
        """Leave the group (the head waits for its peers); once."""
        if self.coord is not None:
            self.coord.close()
            self.coord = None

    def on_final(self, status: str, reason: str) -> None:
        """This node's run ends: a stop reaches every node."""
        if self.coord is not None and status == "stopped":
            self.coord.request_stop(reason)

    # --- the other nodes ----------------------------------------------------------------------
    def lost_reason(self, lost: list[tuple[int, float]]) -> str:
        """Why the head ends on a silent peer: the head itself stopped longer than
        node_lost_s (the peer took it for lost), the peer said it left, or it is lost."""
        k, s = lost[0]
        gs, c = self.gs, self._c()
        stalled = c.own_silent_s(time.monotonic())
        if stalled > gs.node_lost_s:
            return head_stalled_reason(gs.host, stalled, gs.node_lost_s, gs.nodes[k], gs.name)
        if c.left(k):
            return node_left_reason(gs.nodes[k], gs.name)
        return node_lost_reason(gs.nodes[k], s, gs.name)

    def _lost_end(self, k: int, s: float) -> NodeOutcome:
        return lost_end(k, self.gs.nodes[k], s, self.gs.name, self.lost_reason([(k, s)]))

    def sync_stop(self) -> None:
        """A SIGTERM here reaches every node (KEY_STOP); one there reaches this node."""
        c = self._c()
        if self.stop.reason:
            c.request_stop(self.stop.reason)
        else:
            why = c.stop_requested()
            if why:
                self.stop.request(f"stop requested: {why}")

    def settle(self, n: int, out: Outcome, diag: Diagnosis) -> tuple[Diagnosis, Ending | None]:
        return diag, None    # a member reports its end; the head settles the run

    def clears_caches(self, n: int) -> bool:
        return bool(self.attempt(n).caches_cleared)

    def on_restart(self, n: int, fallback: Any, restart: Any) -> None:
        pass                 # the head decides

    def _c(self) -> Coordinator:
        assert self.coord is not None, "the group's store is not open"
        return self.coord

    # --- one attempt ----------------------------------------------------------------------------
    def attempt(self, n: int) -> GroupAttempt:
        """This node's part in attempt N (a fresh record when N is a new attempt)."""
        if self.current is None or self.current.n != n:
            self.current = GroupAttempt(n)
        return self.current

    def thresholds(self, t: Thresholds) -> Thresholds:
        return t

    def _placement(self, n: int, resume: str | None) -> Placement:
        gs = self.gs
        rdzv = Rendezvous(gs.nnodes, gs.head_addr, gs.port, gs.rdzv_id(self.run_id, n),
                          is_host=gs.is_head, local_addr=local_addr(gs.head_addr, gs.port))
        return Placement(resume, rdzv, group_env(gs.node, gs.env), gs.nproc)

    def tick(self, n: int, proc: subprocess.Popen, out: Outcome, dog: AttemptWatchdog,
             now: float) -> None:
        """Once per watch poll: stop, a peer's abort, this node's own failure, a lost node."""
        c, gs, at = self._c(), self.gs, self.attempt(n)
        if now < at.store_next:
            self._kill_due(proc, at, now)
            return
        at.store_next = now + STORE_POLL_S
        if at.lost is None:   # a lost node's store (the head's) would only time out
            self.sync_stop()
        if out.stopped or self.stop.reason:
            return
        if at.lost is None:
            self._share_stopped(n, at, dog, now)
        if at.peer_abort is None and at.lost is None:
            if dog.term_at is not None or dog.hang:
                if not at.abort_set:
                    at.abort_set = True
                    at.origin = c.abort(n, f"node {gs.host}: {dog.hang or 'a fatal line'}")
            else:
                r = c.aborted(n)
                if r is not None and r.node != gs.node:
                    at.peer_abort = f"node {r.host} aborted attempt {n}: {r.reason}"
                    self.record.emit(events.PeerAbort(attempt=n, node=gs.node, host=gs.host,
                                                      reason=at.peer_abort))
                    self._terminate(proc, at, now)
                else:
                    lost = c.lost(now)
                    if lost:
                        at.lost = lost
                        why = self.lost_reason(lost)
                        for k, s in lost:
                            self.record.emit(events.NodeLost(attempt=n, node=k, host=gs.nodes[k],
                                                             silent_s=round(s, 1), reason=why))
                        if gs.is_head:   # a peer that lost the head has no store to tell
                            c.abort(n, why)
                        self._terminate(proc, at, now)
        self._kill_due(proc, at, now)

    def _share_stopped(self, n: int, at: GroupAttempt, dog: AttemptWatchdog,
                       now: float) -> None:
        """A member tells the store when its stopped processes change; the head reads its
        peers' into its watchdog, so a hang that comes due while a peer's process is stopped
        is that peer's freeze (``frozen``, naming it), not the head's ``compile_hang``."""
        c, gs = self._c(), self.gs
        if not gs.is_head:
            if dog.stopped_pids != at.stopped_told:
                c.set_stopped(n, dog.stopped_pids)
                at.stopped_told = dog.stopped_pids
            return
        for k in range(1, gs.nnodes):
            pids = c.stopped(n, k)
            if pids:
                dog.stopped_elsewhere(now, gs.nodes[k], pids)
                return
        dog.stopped_elsewhere(now, None)

    def _terminate(self, proc: subprocess.Popen, at: GroupAttempt, now: float) -> None:
        procs.signal_all([proc.pid], signal.SIGTERM)
        at.kill_at = now + self.kill_grace_s

    def _kill_due(self, proc: subprocess.Popen, at: GroupAttempt, now: float) -> None:
        if at.kill_at is not None and now >= at.kill_at and proc.poll() is None:
            procs.kill_tree(proc.pid, self.run_dir, sig=signal.SIGKILL)
            at.kill_at = now + 2.0

    def after_watch(self, n: int, out: Outcome, dog: AttemptWatchdog) -> None:
        """The attempt's process is gone: a stop that came meanwhile; else, unless it
        finished training, tell the others (the first to abort is the origin)."""
        c, at = self._c(), self.attempt(n)
        at.frozen_on = dog.frozen_on
        self.sync_stop()
        if self.stop.reason and not out.stopped and out.exit_code != 0:
            out.stopped = True
        if out.stopped or out.exit_code == 0 or at.abort_set:
            return
        at.abort_set = True
        how = f"signal {out.signal}" if out.signal else f"exit {out.exit_code}"
        mine = c.abort(n, f"node {self.gs.host}: attempt {n} ended ({how})")
        at.origin = at.origin or (mine and at.peer_abort is None)

    def end_name(self, n: int, diag: Diagnosis) -> tuple[str, str]:
        """The class and reason of this node's end of attempt N: another node's abort
        (``peer_abort``) unless this node aborted first; the head's part that was stopped
        for a lost node is a crash."""
        at = self.attempt(n)
        if at.lost and self.gs.is_head:
            return "crash", "stopped: a node was lost"
        if at.peer_abort and not at.origin:
            return PEER_ABORT, at.peer_abort
        return diag.cls, diag.reason

    def node_end(self, n: int, out: Outcome, diag: Diagnosis, *,
                 cache_fault: str | None = None) -> NodeOutcome:
        gs = self.gs
        cls, reason = self.end_name(n, diag)
        return NodeOutcome(node=gs.node, host=gs.host, cls=cls, reason=reason,
                           exit_code=out.exit_code, reached_train=out.reached_train,
                           healthy_s=round(out.healthy_s, 3),
                           permanent=diag.permanent and cls == diag.cls,
                           origin=bool(self.attempt(n).origin),
                           evidence=diag.evidence,
                           cache_fault=cache_fault)


class GroupHead(GroupRole):
    """Node 0: runs the attempt loop for the whole run."""

    def __init__(self, *a: Any, **kw: Any):
        super().__init__(*a, **kw)
        #: the root cause of the last attempt (supervisor.policy.group_decide.root_cause), for its decision
        self.cause: NodeOutcome | None = None
        #: the last attempt whose decision was published (0: none)
        self.decided = 0

    def run(self, driver: Driver) -> int:
        return driver.loop()

    def restarted(self, attempt: int, abandoned: bool) -> str | None:
        return head_restarted_reason(self.gs.name, attempt)

    def place(self, n: int, find_resume: Callable[[], str | None]) -> Placement:
        """What every node runs as attempt N: published as the attempt's plan."""
        at = self._placement(n, find_resume())
        self._c().set_plan(n, AttemptPlan(overrides=copied(self.record.state.overrides),
                                          resume=at.resume,
                                          rdzv_id=self.gs.rdzv_id(self.run_id, n)))
        return at

    def settle(self, n: int, out: Outcome, diag: Diagnosis) -> tuple[Diagnosis, Ending | None]:
        """Every node's end of attempt N (a silent node: ``node_lost``), one root cause.
        Updates ``out`` (healthy_s, reached_train) to the run's."""
        diag = self._root(n, out, diag)
        if out.stopped or self.stop.reason:
            return diag, ("stopped", self.stop.reason or "stopped")
        if diag.cls == NODE_LOST:
            self.record.emit(events.GiveUp(cls=diag.cls, reason=diag.reason, evidence=[]))
            return diag, ("failed", diag.reason)
        return diag, None

    def _root(self, n: int, out: Outcome, diag: Diagnosis) -> Diagnosis:
        c, gs, emit, at = self._c(), self.gs, self.record.emit, self.attempt(n)
        own = self.node_end(n, out, diag)
        c.set_end(n, own)
        ends = {0: own}
        for k, s in (at.lost or []):
            ends[k] = self._lost_end(k, s)
        emit(own.event(n))
        while len(ends) < gs.nnodes:
            self.lost = []
            for k in range(1, gs.nnodes):
                if k not in ends:
                    e = c.end(n, k)
                    if e is not None:
                        ends[k] = e
                        emit(e.event(n))
            if len(ends) == gs.nnodes:
                break
            self.sync_stop()
            if self.stop.reason:
                out.stopped = True
                return diag
            for k, s in c.lost(time.monotonic()):
                if k not in ends:
                    ends[k] = self._lost_end(k, s)
                    emit(events.NodeLost(attempt=n, node=k, host=gs.nodes[k],
                                         silent_s=round(s, 1), reason=ends[k].reason))
            time.sleep(STORE_POLL_S)
        root = root_cause(list(ends.values()))
        # the head judged a freeze on a peer (its stopped processes): the cause is there
        cause = (dataclasses.replace(root, node=gs.nodes.index(at.frozen_on),
                                     host=at.frozen_on)
                 if root.node == gs.node and root.cls == "frozen" and at.frozen_on else root)
        self.cause = cause
        at.caches_cleared = caches_cleared([e for e in ends.values() if e.node != gs.node])
        out.healthy_s = run_healthy_s(list(ends.values()))
        out.reached_train = run_reached_train(list(ends.values()))
        if root.node == 0 and root.cls == diag.cls:
            return diag
        # a lost node's reason names the node (or says the head itself was not answering)
        said = root.reason if root.cls == NODE_LOST else on_node(root.host, root.reason)
        return Diagnosis(root.cls, said, permanent=root.permanent)

    def decide(self, n: int, action: str, *, status: str = "", reason: str = "",
               fallback: events.Fallback | None = None,
               restart: events.Restart | None = None) -> None:
        """Publish the run's decision on attempt N (and record it here too)."""
        gs, state = self.gs, self.record.state
        dec = GroupVerdict(action=action, cause=self.cause, status=status,
                           reason=reason, overrides=copied(state.overrides),
                           fallback=fallback, restart=restart,
                           last_checkpoint=state.last_checkpoint, last_step=state.last_step)
        self._c().set_decision(n, dec)
        self.decided = n
        self.record.emit(events.GroupDecision(attempt=n, node=gs.node, host=gs.host,
                                              action=dec.action, status=dec.status,
                                              reason=dec.reason, cause=dec.cause))

    def on_restart(self, n: int, fallback: Any, restart: Any) -> None:
        self.decide(n, "restart", fallback=fallback, restart=restart)

    def on_final(self, status: str, reason: str) -> None:
        """The head's final word goes to the attempt the peers wait on (the next one when
        this one was already decided: a stop during the backoff)."""
        if self.coord is None:
            return
        super().on_final(status, reason)
        if self.record.state.attempt:
            n = int(self.record.state.attempt)
            self.decide(n + 1 if self.decided >= n else n, "final", status=status,
                        reason=reason)
