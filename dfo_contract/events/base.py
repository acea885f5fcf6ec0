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
import types
import typing
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, ClassVar, Mapping, Self

from ..errors import ContractError, VersionError
from ..fsio import json_safe

#: the format version of every record this dfo writes; a reader refuses any other
VERSION = 1

#: the fields every record has besides its kind's (``v`` and ``kind`` are not fields)
ENVELOPE = ("t", "mono")
_JSON = "json"            # field metadata: the field's JSON name when it differs
_OPTIONAL = "optional"    # field metadata: may be absent; written only when not None


def now() -> float:
    return round(time.time(), 3)


def opt(default: Any = None, *, json: str | None = None, factory: Any = None) -> Any:
    """An optional field: absent in a record reads as its default; None is not written."""
    meta = {_OPTIONAL: True, **({_JSON: json} if json else {})}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def req(*, json: str | None = None) -> Any:
    """A required field whose JSON name differs from the attribute (``class``)."""
    return field(metadata={_JSON: json} if json else {})


def json_name(f: Any) -> str:
    return f.metadata.get(_JSON, f.name)


@dataclass(frozen=True, kw_only=True)
class EventBase:
    """One record of ``events.jsonl``; ``t`` is when it was written (epoch seconds)."""

    kind: ClassVar[str] = ""
    t: float = field(default_factory=now)
    #: the writer's CLOCK_MONOTONIC when written (a supervisor stamps its own records):
    #: durations between records of one boot that a step of the wall clock does not change
    mono: float | None = field(default=None, metadata={_OPTIONAL: True})

    def describe(self) -> str:
        """One short human line (status tables, ``dfo logs``, state.json's last_event)."""
        return self.kind

    def evidence_texts(self) -> list[str]:
        """The text of each evidence line (``classified``, ``give_up``, ``node_end``)."""
        ev = getattr(self, "evidence", None) or []
        return [str(x.get("text", "")) if isinstance(x, Mapping) else str(x) for x in ev]

    def body(self) -> dict[str, Any]:
        """The record's fields without ``v``, ``t``, ``mono`` and ``kind`` (JSON names,
        JSON-safe)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            if f.name in ENVELOPE:
                continue
            v = getattr(self, f.name)
            if v is None and f.metadata.get(_OPTIONAL):
                continue
            out[json_name(f)] = json_safe(v)
        return out

    def to_dict(self) -> dict[str, Any]:
        if not self.kind:
            raise ContractError(f"{type(self).__name__} has no kind: it cannot be written")
        mono = {} if self.mono is None else {"mono": json_safe(self.mono)}
        return {"v": VERSION, "t": json_safe(self.t), **mono, "kind": self.kind, **self.body()}

    @classmethod
    def from_body(cls, body: Mapping[str, Any], **defaults: Any) -> Self:
        """An event from its fields (JSON names); ``defaults`` (attribute names) fill the
        ones ``body`` lacks. ContractError when a field is missing or mistyped."""
        if not isinstance(body, Mapping):
            raise ContractError(f"a {cls.kind} record is not a JSON object")
        hints = _hints(cls)
        kw: dict[str, Any] = {}
        for f in fields(cls):
            key = json_name(f)
            if key in body:
                kw[f.name] = _check(cls.kind, key, body[key], hints[f.name])
            elif f.name in defaults:
                kw[f.name] = defaults[f.name]
            elif f.name == "t":
                kw["t"] = 0.0
            elif f.default is MISSING and f.default_factory is MISSING:
                raise ContractError(f"a {cls.kind} record lacks its {key!r} field")
        return cls(**kw)


def check_version(obj: Mapping[str, Any]) -> None:
    """Absent ``v``: a record from before versions were written (version 1)."""
    v = obj.get("v", 1)
    if isinstance(v, bool) or not isinstance(v, int):
        raise ContractError(f"a record's version is {v!r}, not a number")
    if v != VERSION:
        raise VersionError(f"a record of format version {v}: this dfo reads version "
                           f"{VERSION}")


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _check(kind: str, key: str, value: Any, hint: Any) -> Any:
    """``value`` as the field's type, or ContractError (one line, naming kind and field)."""
    ok, out = _coerce(value, hint)
    if not ok:
        raise ContractError(f"a {kind} record's {key!r} is {type(value).__name__} "
                            f"{_short(value)}, expected {_name(hint)}")
    return out


def _coerce(value: Any, hint: Any) -> tuple[bool, Any]:
    if hint is Any:
        return True, value
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(hint):
            ok, out = _coerce(value, arg)
            if ok:
                return True, out
        return False, value
    if hint is type(None):
        return value is None, value
    if hint is bool:
        return isinstance(value, bool), value
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool), value
    if hint is float:
        if isinstance(value, bool):
            return False, value
        if isinstance(value, (int, float)):
            return True, float(value)
        if isinstance(value, str) and value.lower() in ("nan", "inf", "-inf", "infinity",
                                                        "-infinity"):
            return True, float(value)
        return False, value
    if hint is str:
        return isinstance(value, str), value
    if hint is list or origin is list:
        if not isinstance(value, list):
            return False, value
        (arg,) = typing.get_args(hint) or (Any,)
        out = []
        for x in value:
            ok, y = _coerce(x, arg)
            if not ok:
                return False, value
            out.append(y)
        return True, out
    if hint is dict or origin is dict:
        return isinstance(value, dict), value
    raise TypeError(f"unsupported field type {hint!r}")


def _name(hint: Any) -> str:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " or ".join(_name(a) for a in typing.get_args(hint))
    if hint is type(None):
        return "null"
    return getattr(hint, "__name__", str(hint))


def _short(value: Any) -> str:
    s = repr(value)
    return s if len(s) <= 40 else s[:37] + "..."
