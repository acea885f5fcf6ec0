"""The ``events.jsonl`` kinds of one run over several nodes (spec ``group``): one frozen
``kw_only`` dataclass each, as in ``events.kinds``; and :class:`NodeOutcome`, one node's end
of an attempt, which its ``node_end`` event records and the head's ``group_decision`` names
as the cause (the group store carries it too: ``dfo_contract.group_store``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping, Self

from ..codec import JSON, decode, encode
from ..state_records import CheckpointRef, EvidenceLine, Overrides
from .base import EventBase, opt, req
from .kinds import Fallback, Restart


# --- one run over several nodes (spec ``group``); each names the node and its host -----------

@dataclass(frozen=True, kw_only=True)
class GroupStart(EventBase):
    kind: ClassVar[str] = "group_start"
    node: int
    host: str
    nodes: list[str]
    head_addr: str
    coord_port: int

    def describe(self) -> str:
        return (f"node {self.node} ({self.host}) of {len(self.nodes or [])}, "
                f"coordinating through {self.head_addr}:{self.coord_port}")


@dataclass(frozen=True, kw_only=True)
class PeerAbort(EventBase):
    """Another node's attempt failed; this node stopped its own."""
    kind: ClassVar[str] = "peer_abort"
    attempt: int
    node: int
    host: str
    reason: str

    def describe(self) -> str:
        return f"attempt {self.attempt} stopped: {self.reason}"


@dataclass(frozen=True)
class NodeOutcome:
    """One node's own classification of its part of attempt N: the group store's
    ``key_end(N, node)`` message, the ``node_end`` event (:meth:`event`) and the ``cause`` of
    the head's decision. JSON: its fields, ``class`` for ``cls``."""
    node: int
    host: str
    cls: str = field(metadata={JSON: "class"})
    reason: str
    exit_code: int | None = None
    reached_train: bool = False
    healthy_s: float = 0.0
    permanent: bool = False
    #: this node set ``key_abort(N)`` first: its end is where the attempt went wrong
    origin: bool = False
    evidence: tuple[EvidenceLine, ...] = ()
    #: the line of its output saying its part died at start-up loading a shared object from
    #: its run's compile cache (``supervisor.policy.cache_check``): a restart clears that node's cache
    cache_fault: str | None = None
    #: the node's supervisor died during the attempt (its trainer went with it) and its
    #: restarted supervisor reports this end: the cause of the other nodes' failures
    supervisor_died: bool = False

    def to_json(self) -> dict[str, Any]:
        """The fields (JSON names), without the group store's ``v``."""
        out: dict[str, Any] = encode(self)
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Self:
        """Read tolerant, as the group store reads its messages: a missing ``host`` or
        ``reason`` reads as ``""``, a mistyped optional field as its default."""
        return decode(cls, d, what="a node outcome", tolerant=True, host="", reason="")

    def event(self, attempt: int) -> NodeEnd:
        """This outcome as the ``node_end`` event of attempt ``attempt``."""
        return NodeEnd(attempt=attempt, node=self.node, host=self.host, cls=self.cls,
                       reason=self.reason, exit_code=self.exit_code,
                       reached_train=self.reached_train, healthy_s=self.healthy_s,
                       permanent=self.permanent, origin=self.origin,
                       evidence=list(self.evidence))


@dataclass(frozen=True, kw_only=True)
class NodeEnd(EventBase):
    """One node's own judgement of its part of an attempt (:class:`NodeOutcome`)."""
    kind: ClassVar[str] = "node_end"
    attempt: int
    node: int
    host: str
    cls: str = req(json="class")
    reason: str
    exit_code: int | None
    reached_train: bool
    healthy_s: float
    permanent: bool
    origin: bool               # this node aborted the attempt first
    evidence: list[EvidenceLine]

    def describe(self) -> str:
        return f"node {self.node} ({self.host}) attempt {self.attempt}: {self.cls}: " \
            f"{self.reason}"


@dataclass(frozen=True, kw_only=True)
class NodeLost(EventBase):
    kind: ClassVar[str] = "node_lost"
    attempt: int
    node: int
    host: str
    silent_s: float
    reason: str

    def describe(self) -> str:
        return str(self.reason or f"node {self.host} lost")


@dataclass(frozen=True, kw_only=True)
class GroupDecision(EventBase):
    """The head's decision on an attempt; a peer's record of it also carries the rest of
    the decision (``group_store.GroupVerdict``: overrides, the ``fallback`` and ``restart``
    events, ...)."""
    kind: ClassVar[str] = "group_decision"
    attempt: int
    node: int
    host: str
    action: str                # restart | final
    status: str
    reason: str
    #: the root cause: a node's outcome (None: none was judged)
    cause: NodeOutcome | None = opt()
    overrides: Overrides | None = opt()
    fallback: Fallback | None = opt()
    restart: Restart | None = opt()
    last_checkpoint: CheckpointRef | None = opt()
    last_step: int | None = opt()      # the newest step marker's ``step``

    def describe(self) -> str:
        c = self.cause
        what = ("restart" if self.action == "restart"
                else f"final {self.status}: {self.reason}")
        return f"head's decision on attempt {self.attempt}: {what} (cause " \
            f"{c.cls if c else None} on {c.host if c else None})"

    @classmethod
    def from_body(cls, body: Mapping[str, Any], **defaults: Any) -> Self:
        """Read as :func:`decision_body` says."""
        return super().from_body(decision_body(body), **defaults)


def decision_body(body: Mapping[str, Any]) -> dict[str, Any]:
    """A head's decision (the ``group_decision`` event, the group store's ``GroupVerdict``)
    as the codec reads it: ``cause: {}`` is no cause, and a ``fallback`` / ``restart``
    without its ``t`` has ``t`` 0 (as a record without one reads)."""
    fix: dict[str, Any] = {}
    if body.get("cause") == {}:
        fix["cause"] = None
    for k in ("fallback", "restart"):
        v = body.get(k)
        if isinstance(v, Mapping) and "t" not in v:
            fix[k] = {"t": 0.0, **v}
    return {**body, **fix}
