"""One multi-node run, one decision: the pure choices the node supervisors make
(``orchestrator.supervisor.group`` does the store I/O). No I/O, no clock: time comes in.

- :class:`NodeEnd`: how one node's part of an attempt ended (its own classification);
- :func:`root_cause`: the one end the head decides on for the whole run;
- :class:`Heartbeats`: whether a node is lost, from the heartbeat counters the head (or a
  peer, for the head) observed and when;
- :class:`GroupDecision`: what the head tells every node after an attempt (restart with
  what, or final), and what a peer mirrors of it into its own state and events.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from dfo_contract import events

from .classify import NODE_LOST, PEER_ABORT, PRIORITY


@dataclass(frozen=True)
class NodeEnd:
    """One node's classification of its part of attempt N (``key_end(N, node)``)."""
    node: int
    host: str
    cls: str
    reason: str
    exit_code: int | None = None
    reached_train: bool = False
    healthy_s: float = 0.0
    permanent: bool = False
    #: this node set ``key_abort(N)`` first: its end is where the attempt went wrong
    origin: bool = False
    evidence: tuple[dict, ...] = ()
    #: the line of its output saying its part died at start-up loading a shared object from
    #: its run's compile cache (``ops.cache_check``): a restart clears that node's cache
    cache_fault: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "host": self.host, "class": self.cls, "reason": self.reason,
                "exit_code": self.exit_code, "reached_train": self.reached_train,
                "healthy_s": self.healthy_s, "permanent": self.permanent,
                "origin": self.origin, "evidence": list(self.evidence),
                "cache_fault": self.cache_fault}

    def event(self, attempt: int) -> events.NodeEnd:
        """This end as the ``node_end`` event of attempt ``attempt``."""
        return events.NodeEnd(attempt=attempt, node=self.node, host=self.host, cls=self.cls,
                              reason=self.reason, exit_code=self.exit_code,
                              reached_train=self.reached_train, healthy_s=self.healthy_s,
                              permanent=self.permanent, origin=self.origin,
                              evidence=list(self.evidence))

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "NodeEnd":
        ec = d.get("exit_code")
        return cls(node=int(d["node"]), host=str(d.get("host", "")), cls=str(d["class"]),
                   reason=str(d.get("reason", "")), exit_code=None if ec is None else int(ec),
                   reached_train=bool(d.get("reached_train")),
                   healthy_s=float(d.get("healthy_s") or 0.0),
                   permanent=bool(d.get("permanent")), origin=bool(d.get("origin")),
                   evidence=tuple(d.get("evidence") or ()),
                   cache_fault=None if d.get("cache_fault") is None else str(d["cache_fault"]))


def lost_end(node: int, host: str, silent_s: float, group: str) -> NodeEnd:
    return NodeEnd(node=node, host=host, cls=NODE_LOST, reason=node_lost_reason(host, silent_s,
                                                                                 group))


def node_lost_reason(host: str, silent_s: float, group: str) -> str:
    return (f"node {host} lost (no heartbeat for {silent_s:.0f} s); start it, then "
            f"dfo launch --group {group} --resume latest")


def head_lost_reason(host: str, silent_s: float) -> str:
    return (f"lost the head node {host} (no answer for {silent_s:.0f} s); the head decides "
            f"for the whole run: see its status, then dfo launch --group ... --resume latest")


def head_restarted_reason(group: str, attempt: int) -> str:
    """A restarted head supervisor cannot re-join its own run (yet): why, and what to do."""
    return (f"the head's supervisor restarted during attempt {attempt} and lost the group's "
            "state (the coordination store it hosts would start empty; the peers' connections "
            "to the old one are gone), so the run cannot go on; the peers end by themselves "
            f"(lost the head node), then dfo launch --group {group} --resume latest")


def _rank(e: NodeEnd) -> tuple:
    """Lower is a better root cause: a node lost; then a real class over ``peer_abort``;
    then the most specific class (classify.PRIORITY: a secondary 'crash' of a node whose
    peer died loses to the peer's FX error); then the node that aborted first; then the
    lowest node index."""
    order = {c: i for i, c in enumerate(PRIORITY)}
    return (e.cls != NODE_LOST, e.cls == PEER_ABORT, order.get(e.cls, len(order)),
            not e.origin, e.node)


def root_cause(ends: Sequence[NodeEnd]) -> NodeEnd:
    """The end the run's decision is about. ``done`` on the head (node 0, the main rank)
    with no node lost is a finished run; otherwise the best-ranked failure. A run whose
    every node says ``peer_abort`` (the one that aborted never reported) is a ``crash``."""
    if not ends:
        raise ValueError("no node ends")
    lost = [e for e in ends if e.cls == NODE_LOST]
    if lost:
        return min(lost, key=lambda e: e.node)
    head = [e for e in ends if e.node == 0]
    if head and head[0].cls == "done":
        return head[0]
    failed = [e for e in ends if e.cls != "done"]
    best = min(failed or ends, key=_rank)
    if best.cls == PEER_ABORT:
        return NodeEnd(node=best.node, host=best.host, cls="crash",
                       reason=f"every node stopped for a peer's abort ({best.reason})",
                       exit_code=best.exit_code, reached_train=best.reached_train,
                       healthy_s=best.healthy_s, origin=best.origin)
    return best


def caches_cleared(ends: Sequence[NodeEnd]) -> tuple[str, ...]:
    """The nodes whose run's compile cache a restart clears (their part died at start-up
    loading a shared object from it): the next attempt does not meet the same cache, so the
    restart changes something even with the same config (``budget.cannot_do_better``)."""
    return tuple(e.host for e in ends if e.cache_fault)


def run_healthy_s(ends: Sequence[NodeEnd]) -> float:
    """The attempt trained healthily as long as its shortest-lived node did (metrics come
    from the head; a peer reports 0 when it has no steps of its own, so take the head's)."""
    head = [e for e in ends if e.node == 0]
    return head[0].healthy_s if head else min((e.healthy_s for e in ends), default=0.0)


def run_reached_train(ends: Sequence[NodeEnd]) -> bool:
    head = [e for e in ends if e.node == 0]
    return head[0].reached_train if head else any(e.reached_train for e in ends)


# --- heartbeats ----------------------------------------------------------------------------

@dataclass
class Heartbeats:
    """The head's view of each node's heartbeat counter (``store.add(key_heartbeat(k), 1)``
    every second): a node whose counter did not change for ``lost_s`` seconds of the
    observer's own monotonic clock is lost (node clocks may differ; counters do not care)."""
    lost_s: float
    start: float
    last_value: dict[int, int] = field(default_factory=dict)
    last_change: dict[int, float] = field(default_factory=dict)

    def observe(self, node: int, value: int | None, now: float) -> None:
        """``value``: the counter read now (None: it could not be read)."""
        if value is None:
            return
        if self.last_value.get(node) != value:
            self.last_value[node] = value
            self.last_change[node] = now

    def silent_s(self, node: int, now: float) -> float:
        return now - self.last_change.get(node, self.start)

    def lost(self, nodes: Sequence[int], now: float) -> list[int]:
        return [k for k in nodes if self.silent_s(k, now) > self.lost_s]


# --- the decision ---------------------------------------------------------------------------

@dataclass(frozen=True)
class GroupDecision:
    """``key_decision(N)``: the head's word on attempt N for every node.

    ``action``: ``restart`` (with ``overrides``; ``fallback`` holds the fallback event's
    fields when the config changed) or ``final`` (``status``, ``reason``)."""
    action: str
    cause: dict[str, Any]
    status: str = ""
    reason: str = ""
    overrides: dict[str, Any] = field(default_factory=dict)
    fallback: dict[str, Any] | None = None
    restart: dict[str, Any] | None = None
    last_checkpoint: dict[str, Any] | None = None
    last_step: Any = None

    def to_json(self) -> dict[str, Any]:
        return {"action": self.action, "cause": dict(self.cause), "status": self.status,
                "reason": self.reason, "overrides": dict(self.overrides),
                "fallback": self.fallback, "restart": self.restart,
                "last_checkpoint": self.last_checkpoint, "last_step": self.last_step}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "GroupDecision":
        if d.get("action") not in ("restart", "final"):
            raise ValueError(f"unknown group decision {d.get('action')!r}")
        return cls(action=str(d["action"]), cause=dict(d.get("cause") or {}),
                   status=str(d.get("status") or ""), reason=str(d.get("reason") or ""),
                   overrides=dict(d.get("overrides") or {}), fallback=d.get("fallback"),
                   restart=d.get("restart"), last_checkpoint=d.get("last_checkpoint"),
                   last_step=d.get("last_step"))


@dataclass(frozen=True)
class PeerStep:
    """What a peer does with the head's decision: the events to mirror in order, the
    overrides it runs next, the final status/reason (None: run attempt N+1), the fallback
    record for its state.json and whether to restore the compile cache first."""
    events: tuple[events.Event, ...]
    overrides: dict[str, Any]
    final: tuple[str, str] | None
    fallback: dict[str, Any] | None
    restore_cache: bool = False


def peer_step(dec: GroupDecision, attempt: int, *, node: int, host: str) -> PeerStep:
    """The head's ``fallback``/``restart`` travel as their events' bodies
    (``EventBase.body``); a malformed one raises ``ContractError``."""
    evs: list[events.Event] = [events.GroupDecision(
        attempt=attempt, node=node, host=host, action=dec.action, cause=dict(dec.cause),
        status=dec.status, reason=dec.reason, overrides=dict(dec.overrides),
        fallback=dec.fallback, restart=dec.restart, last_checkpoint=dec.last_checkpoint,
        last_step=dec.last_step)]
    if dec.action == "final":
        return PeerStep(tuple(evs), dict(dec.overrides), (dec.status or "failed", dec.reason),
                        None)
    fb, restore = None, False
    if dec.fallback:
        f = events.Fallback.from_body(dec.fallback, attempt=attempt)
        evs.append(f)
        restore = f.restore_cache
        if f.step and f.step != "same":
            fb = {"class": f.cls, "step": f.step, "changed": dict(f.changed or {}),
                  "attempt": attempt}
    if dec.restart:
        evs.append(events.Restart.from_body(dec.restart))
    return PeerStep(tuple(evs), dict(dec.overrides), None, fb, restore)
