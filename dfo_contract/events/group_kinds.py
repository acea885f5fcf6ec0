"""The ``events.jsonl`` kinds of one run over several nodes (spec ``group``): one frozen
``kw_only`` dataclass each, as in ``events.kinds``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from ..state_records import CheckpointRef
from .base import EventBase, opt, req


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


@dataclass(frozen=True, kw_only=True)
class NodeEnd(EventBase):
    """One node's own judgement of its part of an attempt (``group_store.NodeOutcome``)."""
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
    evidence: list[dict[str, Any]]

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
    the decision (``group_store.GroupVerdict``: overrides, fallback, restart, ...)."""
    kind: ClassVar[str] = "group_decision"
    attempt: int
    node: int
    host: str
    action: str                # restart | final
    status: str
    reason: str
    cause: dict[str, Any]      # the root cause: a node_end's fields (class, host, ...)
    overrides: dict[str, Any] | None = opt()
    fallback: dict[str, Any] | None = opt()
    restart: dict[str, Any] | None = opt()
    last_checkpoint: CheckpointRef | None = opt()
    last_step: Any = opt()      # the newest step marker's ``step``

    def describe(self) -> str:
        cause = self.cause or {}
        what = ("restart" if self.action == "restart"
                else f"final {self.status}: {self.reason}")
        return f"head's decision on attempt {self.attempt}: {what} (cause " \
            f"{cause.get('class')} on {cause.get('host')})"
