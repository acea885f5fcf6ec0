"""One multi-node run, one decision: the pure choices the node supervisors make
(``orchestrator.supervisor.group`` does the store I/O). No I/O, no clock: time comes in.

- :func:`root_cause`: the one :class:`~dfo_contract.events.group_kinds.NodeOutcome` (how one
  node's part of an attempt ended, its own classification) the head decides on for the
  whole run;
- :class:`Heartbeats`: whether a node is lost, from the heartbeat counters the head (or a
  peer, for the head) observed and when;
- :func:`peer_step`: what a peer mirrors into its own state and events of the head's
  :class:`~dfo_contract.group_store.GroupVerdict` (restart with what, or final).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from dfo_contract import events
from dfo_contract.group_store import GroupVerdict, NodeOutcome
from dfo_contract.state_records import FallbackRecord, Overrides, copied

from ...common.classify_rules import NODE_LOST, PEER_ABORT, PRIORITY


def on_node(host: str, reason: str) -> str:
    """``reason`` as the run's, naming the node it happened on once (``node lab-b: ...``;
    a reason that already starts with ``node lab-b`` stays as it is)."""
    return reason if reason.startswith(f"node {host} ") or reason.startswith(f"node {host}:") \
        else f"node {host}: {reason}"


def lost_end(node: int, host: str, silent_s: float, group: str,
             reason: str | None = None) -> NodeOutcome:
    """Node ``node``'s end as the head records it when it went silent (``reason``: what the
    head says instead of :func:`node_lost_reason`)."""
    return NodeOutcome(node=node, host=host, cls=NODE_LOST,
                       reason=reason or node_lost_reason(host, silent_s, group))


def head_stalled_reason(head: str, stalled_s: float, lost_s: float, peer: str,
                        group: str) -> str:
    """The head itself did not run for ``stalled_s`` (more than node_lost_s) while a peer
    went silent: the peer took the head for lost and ended; nothing says it failed."""
    return (f"the head {head} itself was not answering for {stalled_s:.0f} s (its supervisor "
            f"was stopped: SIGSTOP, a frozen container or VM), longer than node_lost_s "
            f"({lost_s:.0f} s): node {peer} took the head for lost and ended its part (its "
            f"status says so); nothing says {peer} failed; dfo launch --group {group} "
            "--resume latest")


def node_left_reason(host: str, group: str) -> str:
    """A peer said it was leaving (``left/<k>``) while the head waited on it."""
    return (f"node {host} left the run (its supervisor ended: dfo status --group {group} "
            f"shows why), then dfo launch --group {group} --resume latest")


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


def _rank(e: NodeOutcome) -> tuple:
    """Lower is a better root cause: a node lost; then a node whose supervisor died during
    the attempt (every other node failed because its part went); then a real class over
    ``peer_abort``; then the most specific class (classify_rules.PRIORITY: a secondary
    'crash' of a node whose peer died loses to the peer's FX error); then the node that
    aborted first; then the lowest node index."""
    order = {c: i for i, c in enumerate(PRIORITY)}
    return (e.cls != NODE_LOST, not e.supervisor_died, e.cls == PEER_ABORT,
            order.get(e.cls, len(order)), not e.origin, e.node)


def root_cause(ends: Sequence[NodeOutcome]) -> NodeOutcome:
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
        return NodeOutcome(node=best.node, host=best.host, cls="crash",
                           reason=f"every node stopped for a peer's abort ({best.reason})",
                           exit_code=best.exit_code, reached_train=best.reached_train,
                           healthy_s=best.healthy_s, origin=best.origin)
    return best


def caches_cleared(ends: Sequence[NodeOutcome]) -> tuple[str, ...]:
    """The nodes whose run's compile cache a restart clears (their part died at start-up
    loading a shared object from it): the next attempt does not meet the same cache, so the
    restart changes something even with the same config (``budget.cannot_do_better``)."""
    return tuple(e.host for e in ends if e.cache_fault)


def run_healthy_s(ends: Sequence[NodeOutcome]) -> float:
    """The attempt trained healthily as long as its shortest-lived node did (metrics come
    from the head; a peer reports 0 when it has no steps of its own, so take the head's)."""
    head = [e for e in ends if e.node == 0]
    return head[0].healthy_s if head else min((e.healthy_s for e in ends), default=0.0)


def run_reached_train(ends: Sequence[NodeOutcome]) -> bool:
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
    #: this node's own beats: the last one, and the longest gap between two (when it ended)
    own_last: float | None = None
    own_gap: tuple[float, float] = (0.0, 0.0)

    def tick(self, now: float) -> None:
        """This node's own heartbeat ran at ``now`` (a gap: this process did not run)."""
        if self.own_last is not None and now - self.own_last >= self.own_gap[0]:
            self.own_gap = (now - self.own_last, now)
        self.own_last = now

    def own_silent_s(self, now: float) -> float:
        """How long this node itself did not beat, lately (the longest gap that ended
        within two node_lost_s, or the one going on): its peers' silence over that time
        says nothing about them."""
        going = now - self.own_last if self.own_last is not None else 0.0
        gap, ended = self.own_gap
        return max(going, gap if now - ended <= 2 * self.lost_s else 0.0)

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


# --- what a peer does with the head's verdict ---------------------------------------------

@dataclass(frozen=True)
class PeerStep:
    """What a peer does with the head's decision: the events to mirror in order, the
    overrides it runs next, the final status/reason (None: run attempt N+1), the fallback
    record for its state.json and whether to restore the compile cache first."""
    events: tuple[events.Event, ...]
    overrides: Overrides
    final: tuple[str, str] | None
    fallback: FallbackRecord | None
    restore_cache: bool = False


def peer_step(dec: GroupVerdict, attempt: int, *, node: int, host: str) -> PeerStep:
    """The head's ``fallback``/``restart`` events travel in its verdict: the peer's
    ``group_decision`` carries them and the peer records each as its own."""
    evs: list[events.Event] = [events.GroupDecision(
        attempt=attempt, node=node, host=host, action=dec.action, cause=dec.cause,
        status=dec.status, reason=dec.reason, overrides=copied(dec.overrides),
        fallback=dec.fallback, restart=dec.restart, last_checkpoint=dec.last_checkpoint,
        last_step=dec.last_step)]
    if dec.action == "final":
        return PeerStep(tuple(evs), copied(dec.overrides), (dec.status or "failed", dec.reason),
                        None)
    fb, restore = None, False
    if dec.fallback:
        f = dec.fallback
        evs.append(f)
        restore = f.restore_cache
        if f.step and f.step != "same":
            fb = FallbackRecord(cls=f.cls, step=f.step, changed=dict(f.changed or {}),
                                attempt=attempt)
    if dec.restart:
        evs.append(dec.restart)
    return PeerStep(tuple(evs), copied(dec.overrides), None, fb, restore)
