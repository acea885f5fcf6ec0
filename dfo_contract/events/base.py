"""The machinery of ``events.jsonl`` records (the kinds are ``events.kinds``; the public
API is ``events``): a frozen ``kw_only`` dataclass per kind, its JSON form and the rules a
reader applies to a record (docs/contracts.md, "Events").

A record on disk is one JSON object: ``{"v": 1, "t": <epoch s>, "kind": "<kind>", ...}``
plus the kind's fields under their JSON names (``class`` for the attribute ``cls``).
Non-finite floats are written as the strings ``"nan"``/``"inf"``/``"-inf"`` (strict JSON)
and read back as floats where the field is a float.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping, Self, Sequence

from ..codec import OPTIONAL, decode, encode, json_name, opt, req
from ..errors import ContractError, VersionError
from ..state_records import EvidenceLine

__all__ = ["VERSION", "ENVELOPE", "EventBase", "check_version", "json_name", "now", "opt",
           "req"]

#: the format version of every record this dfo writes; a reader refuses any other
VERSION = 1

#: the fields every record has besides its kind's (``v`` and ``kind`` are not fields)
ENVELOPE = ("t", "mono")


def now() -> float:
    return round(time.time(), 3)


@dataclass(frozen=True, kw_only=True)
class EventBase:
    """One record of ``events.jsonl``; ``t`` is when it was written (epoch seconds)."""

    kind: ClassVar[str] = ""
    t: float = field(default_factory=now)
    #: the writer's CLOCK_MONOTONIC when written (a supervisor stamps its own records):
    #: durations between records of one boot that a step of the wall clock does not change
    mono: float | None = field(default=None, metadata={OPTIONAL: True})

    def describe(self) -> str:
        """One short human line (status tables, ``dfo logs``, state.json's last_event)."""
        return self.kind

    def evidence_texts(self) -> list[str]:
        """The text of each evidence line (``classified``, ``give_up``, ``node_end``)."""
        ev: Sequence[EvidenceLine] = getattr(self, "evidence", None) or ()
        return [x.text for x in ev]

    def body(self) -> dict[str, Any]:
        """The record's fields without ``v``, ``t``, ``mono`` and ``kind`` (JSON names,
        JSON-safe: ``codec.encode``)."""
        out: dict[str, Any] = encode(self, skip=ENVELOPE)
        return out

    def to_dict(self) -> dict[str, Any]:
        if not self.kind:
            raise ContractError(f"{type(self).__name__} has no kind: it cannot be written")
        mono = {} if self.mono is None else {"mono": encode(self.mono)}
        return {"v": VERSION, "t": encode(self.t), **mono, "kind": self.kind, **self.body()}

    @classmethod
    def from_body(cls, body: Mapping[str, Any], **defaults: Any) -> Self:
        """An event from its fields (JSON names); ``defaults`` (attribute names) fill the
        ones ``body`` lacks. ContractError when a field is missing or mistyped
        (``codec.decode``)."""
        return decode(cls, body, what=f"a {cls.kind} record", **{"t": 0.0, **defaults})


def check_version(obj: Mapping[str, Any]) -> None:
    """Absent ``v``: a record from before versions were written (version 1)."""
    v = obj.get("v", 1)
    if isinstance(v, bool) or not isinstance(v, int):
        raise ContractError(f"a record's version is {v!r}, not a number")
    if v != VERSION:
        raise VersionError(f"a record of format version {v}: this dfo reads version "
                           f"{VERSION}")
