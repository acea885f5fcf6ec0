"""``events.jsonl``: the typed records a run's supervisor writes and every reader decodes.

Writers build an event (``Checkpoint(attempt=2, step=40, path=...)``) and append
``encode_line(ev)``; readers call ``decode(line)`` / ``read_events(text)`` and use the
attributes and ``ev.describe()``. No other module builds or indexes an event's dict.

The rules (docs/contracts.md, "Events"):

- ``v`` is strict: a record without ``v`` is version 1 (written before versions were),
  ``v: 1`` is read, any other version raises :class:`~dfo_contract.errors.VersionError`
  (one line; readers say it and stop, they never guess at a newer format).
- An unknown ``kind`` at version 1 is a newer writer's additional kind: it reads as
  :class:`UnknownEvent`, which keeps its fields and describes itself by its kind.
- A known kind's required fields must be present and every present field must have its
  type (``ContractError`` otherwise); optional fields may be absent; fields this version
  does not know are ignored (a newer writer may add optional fields without a new version).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Mapping, Union

from ..errors import ContractError, NotARecord, VersionError
from .base import VERSION, EventBase, check_version
from .group_kinds import GroupDecision, GroupStart, NodeEnd, NodeLost, PeerAbort
from .kinds import (AttemptEnd, AttemptStart, CacheRestore, Checkpoint, Classified, ConfigEdited,
                    Eval, Fallback, Final, GiveUp, OrphansReaped, Restart, RunFirst, Stacks,
                    StandbyDiscarded, StandbyReady, StandbyStart, StandbyUsed, Stopping,
                    SupervisorStart, ThroughputLow, ThroughputOk, Watchdog)

#: every kind this dfo reads and writes
KINDS: tuple[type[EventBase], ...] = (
    SupervisorStart, OrphansReaped, AttemptStart, Checkpoint, Eval, Watchdog, ConfigEdited,
    ThroughputLow, ThroughputOk, Stacks, CacheRestore, RunFirst, AttemptEnd, Classified,
    Fallback, Restart, GiveUp, Stopping, Final, GroupStart, PeerAbort, NodeEnd, NodeLost,
    GroupDecision, StandbyStart, StandbyReady, StandbyUsed, StandbyDiscarded,
)

__all__ = [
    "VERSION", "REGISTRY", "Event", "EventBase", "UnknownEvent", "ContractError",
    "VersionError", "NotARecord", "decode", "encode_line", "from_dict", "read_events",
    *(k.__name__ for k in KINDS),
]


@dataclass(frozen=True, kw_only=True)
class UnknownEvent(EventBase):
    """A record of a kind this dfo does not know, from a newer writer of the same version.
    Read, never written; it describes itself by its kind (as any reader did before)."""

    kind: str  # type: ignore[misc]  # per record, not per class
    fields: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        return self.kind

    def to_dict(self) -> dict[str, Any]:
        raise ContractError(f"{self.kind!r} is not an event kind this dfo writes")


#: kind -> its class
REGISTRY: dict[str, type[EventBase]] = {k.kind: k for k in KINDS}

Event = Union[
    SupervisorStart, OrphansReaped, AttemptStart, Checkpoint, Eval, Watchdog, ConfigEdited,
    ThroughputLow, ThroughputOk, Stacks, CacheRestore, RunFirst, AttemptEnd, Classified, Fallback, Restart,
    GiveUp, Stopping, Final, GroupStart, PeerAbort, NodeEnd, NodeLost, GroupDecision,
    StandbyStart, StandbyReady, StandbyUsed, StandbyDiscarded, UnknownEvent,
]


def from_dict(obj: Any) -> Event:
    """A record's JSON object as its event (the rules in the module doc)."""
    if not isinstance(obj, Mapping):
        raise NotARecord("an events.jsonl line is not a JSON object")
    check_version(obj)
    kind = obj.get("kind")
    if not isinstance(kind, str) or not kind:
        raise ContractError(f"an events.jsonl record has no kind ({_keys(obj)})")
    cls = REGISTRY.get(kind)
    if cls is None:
        t = obj.get("t")
        rest = {k: v for k, v in obj.items() if k not in ("v", "t", "mono", "kind")}
        return UnknownEvent(kind=kind, fields=rest,
                            t=float(t) if isinstance(t, (int, float)) else 0.0)
    return cls.from_body(obj)  # type: ignore[return-value]


def decode(line: str | bytes) -> Event:
    """One events.jsonl line. NotARecord when it is not a JSON object (blank, torn)."""
    try:
        obj = json.loads(line)
    except ValueError:
        raise NotARecord("an events.jsonl line is not JSON") from None
    return from_dict(obj)


def read_events(text: str) -> list[Event]:
    """Every record of an events.jsonl text; lines that are not records are skipped, a
    record this dfo cannot read faithfully raises (VersionError, ContractError)."""
    out = []
    for ln in text.splitlines():
        if not ln.strip():
            continue
        try:
            out.append(decode(ln))
        except NotARecord:
            continue
    return out


def read_events_file(path: str) -> list[Event]:
    """``read_events`` of the file at ``path``; bytes that are not UTF-8 become U+FFFD, so a
    damaged line is skipped (or read with U+FFFD in a string) and never hides the others.
    Raises OSError (unreadable), VersionError / ContractError (as ``read_events``)."""
    with open(path, "rb") as f:
        return read_events(f.read().decode("utf-8", "replace"))


def encode_line(ev: EventBase) -> bytes:
    """The record as the bytes of one line (sorted keys, strict JSON, one ``write``)."""
    return (json.dumps(ev.to_dict(), sort_keys=True, separators=(",", ":"),
                       allow_nan=False) + "\n").encode()


def _keys(obj: Mapping[str, Any]) -> str:
    ks = sorted(str(k) for k in obj)
    return ", ".join(ks[:6]) + (", ..." if len(ks) > 6 else "") or "empty"
