"""The group store of a multi-node run: its key names and the messages the node
supervisors leave under them (docs/contracts.md, "Group store messages").

The head's supervisor hosts a ``torch.distributed.TCPStore`` on ``head_addr:coord_port``
(``orchestrator.supervisor.coordinator``); every key lives under :func:`key_prefix`. Each
message is a frozen dataclass written as one JSON object ``{"v": VERSION, <fields>}``
(:meth:`to_text`; a node's end: :func:`end_text`) and read back once on another node
(:meth:`from_text`; :func:`read_end`), ContractError when it is not one this version reads.
The heartbeat counters (``store.add``) and the ``left`` flag are plain values, not messages.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping, Self, TypeVar

from . import events
from .codec import decode, encode
from .errors import ContractError, VersionError
from .events.group_kinds import NodeOutcome, decision_body
from .state_records import CheckpointRef, Overrides

#: the format version of every message this dfo writes; a reader refuses any other
VERSION = 1

T = TypeVar("T")


# --- key names (all under the run's prefix) --------------------------------------------------

def key_prefix(run_id: str) -> str:
    return f"dfo/{run_id}/"


def key_heartbeat(node: int) -> str:
    """A counter each node's supervisor increments (``store.add``) every second; the head
    watches it change by its own clock (node clocks may differ)."""
    return f"hb/{node}"


def key_plan(attempt: int) -> str:
    """:class:`AttemptPlan` the head sets before attempt N."""
    return f"plan/{attempt}"


def key_abort(attempt: int) -> str:
    """:class:`AttemptAbort`, set by the first node whose attempt N ended or was judged
    failed (``compare_set``): the others stop theirs."""
    return f"abort/{attempt}"


def key_end(attempt: int, node: int) -> str:
    """:class:`NodeOutcome` each node sets when its part of attempt N ended."""
    return f"end/{attempt}/{node}"


def key_stopped(attempt: int, node: int) -> str:
    """:class:`StoppedPids` a node sets when the stopped processes (state T) of its part of
    attempt N change. The head reads its peers' before it judges a hang."""
    return f"stopped/{attempt}/{node}"


def key_decision(attempt: int) -> str:
    """:class:`GroupVerdict` the head sets after attempt N."""
    return f"decision/{attempt}"


def key_left(node: int) -> str:
    """Set (``"1"``) by a peer's supervisor as it exits: the head keeps the store up until
    then."""
    return f"left/{node}"


#: :class:`StopRequest`, set by any node that got ``dfo stop``: every node stops
KEY_STOP = "stop"


# --- reading ---------------------------------------------------------------------------------

def _fields(d: Any, what: str) -> Mapping[str, Any]:
    """``d`` as a message of this version (absent ``v``: one nested in another message)."""
    if not isinstance(d, Mapping):
        raise ContractError(f"a group store {what} is not a JSON object")
    v = d.get("v", VERSION)
    if v != VERSION:
        raise VersionError(f"a group store {what} of format version {v!r}: this dfo reads "
                           f"version {VERSION}")
    return d


def _load(raw: str | bytes, what: str) -> Mapping[str, Any]:
    try:
        return _fields(json.loads(raw), what)
    except json.JSONDecodeError as e:
        raise ContractError(f"a group store {what} is not JSON: {e}") from None


def _dump(d: Mapping[str, Any]) -> str:
    return json.dumps({"v": VERSION, **d}, sort_keys=True)


def _read(cls: type[T], raw: str | bytes | Mapping[str, Any], what: str, **defaults: Any) -> T:
    """A message of this version through the codec, read tolerant (``defaults``: what a
    missing or mistyped field reads as)."""
    d = _fields(raw, what) if isinstance(raw, Mapping) else _load(raw, what)
    return decode(cls, d, what=f"a group store {what}", tolerant=True, **defaults)


# --- messages --------------------------------------------------------------------------------

@dataclass(frozen=True)
class AttemptPlan:
    """``key_plan(N)``: what every node runs as attempt N (the head's overrides, the
    checkpoint it resumes (a path on the head) and the torchrun rendezvous id)."""
    overrides: Overrides
    resume: str | None
    rdzv_id: str

    def to_text(self) -> str:
        return _dump(encode(self))

    @classmethod
    def from_text(cls, raw: str | bytes) -> "AttemptPlan":
        return _read(cls, raw, "plan", overrides={}, resume=None, rdzv_id="")


@dataclass(frozen=True)
class NodeReason:
    """A node and what it says: the shape :class:`AttemptAbort` and :class:`StopRequest`
    share."""
    node: int
    host: str
    reason: str
    WHAT: ClassVar[str] = "node message"

    def to_text(self) -> str:
        return _dump(encode(self))

    @classmethod
    def from_text(cls, raw: str | bytes) -> Self:
        return _read(cls, raw, cls.WHAT, node=-1, host="", reason="")


@dataclass(frozen=True)
class AttemptAbort(NodeReason):
    """``key_abort(N)``: the node that stopped attempt N first, and why."""
    WHAT: ClassVar[str] = "abort"


def end_text(end: NodeOutcome) -> str:
    """``key_end(N, node)``'s message: the node's :class:`NodeOutcome` (its fields, ``class``
    for ``cls``; defined beside its ``node_end`` event in ``events.group_kinds``)."""
    return _dump(end.to_json())


def read_end(raw: str | bytes) -> NodeOutcome:
    """A ``key_end(N, node)`` message (read tolerant: a missing ``host`` or ``reason`` reads as
    ``""``)."""
    return NodeOutcome.from_json(_load(raw, "node outcome"))


@dataclass(frozen=True)
class StoppedPids:
    """``key_stopped(N, node)``: the node's stopped processes of attempt N, now (empty:
    none)."""
    pids: tuple[int, ...] = ()

    def to_text(self) -> str:
        return _dump(encode(self))

    @classmethod
    def from_text(cls, raw: str | bytes) -> "StoppedPids":
        return _read(cls, raw, "stopped list")


@dataclass(frozen=True)
class GroupVerdict:
    """``key_decision(N)``: the head's word on attempt N for every node (its record in
    events.jsonl is the ``group_decision`` event).

    ``action``: ``restart`` (with ``overrides``; ``fallback`` and ``restart`` are the head's
    ``fallback`` and ``restart`` events, written with their ``t``) or ``final`` (``status``,
    ``reason``). ``cause``: the root cause among the nodes' outcomes (None: none was judged;
    a reader takes ``{}`` as none too)."""
    action: str
    cause: NodeOutcome | None = None
    status: str = ""
    reason: str = ""
    overrides: Overrides = field(default_factory=dict)
    fallback: events.Fallback | None = None
    restart: events.Restart | None = None
    last_checkpoint: CheckpointRef | None = None
    last_step: int | None = None

    def __post_init__(self) -> None:
        if self.action not in ("restart", "final"):
            raise ContractError(f"unknown group decision {self.action!r}")

    def to_text(self) -> str:
        return _dump({**encode(self), "fallback": _event(self.fallback),
                      "restart": _event(self.restart)})

    @classmethod
    def from_text(cls, raw: str | bytes) -> "GroupVerdict":
        """Read tolerant, as the other messages (``cause: {}`` is no cause; a ``fallback`` /
        ``restart`` without ``t`` has ``t`` 0: ``events.group_kinds.decision_body``)."""
        return _read(cls, decision_body(_load(raw, "decision")), "decision")


def _event(e: events.EventBase | None) -> dict[str, Any] | None:
    """An event inside a message: its fields and ``t``, without ``mono`` (the writer's own
    clock)."""
    if e is None:
        return None
    out: dict[str, Any] = encode(e, skip=("mono",))
    return out


@dataclass(frozen=True)
class StopRequest(NodeReason):
    """``KEY_STOP``: a node got ``dfo stop`` (or its supervisor a SIGTERM)."""
    WHAT: ClassVar[str] = "stop request"

    def describe(self) -> str:
        return f"{self.reason} (on node {self.host})"
