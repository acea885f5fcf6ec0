"""The one codec of the records that cross a process: a frozen (or plain) dataclass <-> its
JSON object, driven by the fields' annotations. Events, state.json and its sub-records, the
group store's messages, the remote replies, the follow wire, checkpoint manifests, the
supervisor's heartbeat and its notice, and the trainer's metrics.jsonl records and ``@dfo``
markers all read and write through it.

The rules (docs/contracts.md, "The records' codec"):

- A field's JSON name is its attribute's, or ``field(metadata={"json": ...})`` (``class``
  for ``cls``; :func:`req` / :func:`opt`).
- Types: ``bool``, ``int``, ``float``, ``str``, ``Any``, ``X | None``, ``list[X]``,
  ``tuple[X, ...]``, ``tuple[X, Y]`` (a JSON array of exactly those), ``dict[str, X]`` and
  ``Mapping[str, X]`` (read as a dict), ``Literal[...]``, enums and nested dataclasses.
  A value of another type is a :class:`ContractError` (one line naming the record and key).
- Non-finite floats are written as the strings ``"nan"``/``"inf"``/``"-inf"`` (strict JSON),
  or as null in a record that says so (``NONFINITE: ClassVar[str] = "null"``: the trainer's
  files, metrics.jsonl and the ``@dfo`` markers, which plotting tools read as missing
  values); a nested record that does not say keeps the spelling of the record around it. A
  float field reads the strings (and a bare ``NaN``/``Infinity``) as floats, and null where
  it admits None.
- An error names the place from the record down (:func:`where`: ``spec.json's
  'identity.run_id'``, ``state.json's 'attempts[2]'``).
- A missing field takes its default; a missing field without one is a ContractError. An
  :func:`opt` field that is None is not written.
- A :func:`flag` field is a bool written as ``1`` when true and not at all when false (the
  follow wire's ``"r": 1``); it reads a nonzero integer or ``true`` as true, ``0``,
  ``false``, ``null`` or its absence as false.
- A record read ``tolerant`` (state.json and the status replies: ``dfo status`` shows what
  is on disk, whatever wrote it) takes a mistyped field's default (a tagged union's unknown
  ``kind`` too) instead of refusing
  the record (``"started_at": "yesterday"`` reads as None); a field without a default, or
  a nested record that lacks a required field, is still a ContractError.
- A record class that sets ``TOLERANT = True`` (state.json, its attempts, a run's status) is
  read tolerant wherever it is, also nested in a record read strictly (a query reply).
- Keys the record does not know are kept in its ``extra`` mapping where it has one (written
  back first, so a round trip through an older reader loses none), else ignored (a newer
  writer may add fields without a new version); a record class that sets ``CLOSED = True``
  (spec.json's thresholds: a misspelt limit must not pass unseen) refuses one instead. An
  ``extra`` typed as a tuple of ``(key, value)`` pairs keeps them in the order read.
- A :func:`filtered` field (a list, tuple or mapping) is read item by item: an item that is
  not of the item type is left out instead of the field being mistyped (a trainer's
  ``acc_per_pos`` with a null in it). An ``extra`` marked so keeps only the keys whose values
  are of its value type.
- A :func:`flat` field is a nested record whose keys sit beside the record's own (a run's
  status is its state.json object with the host's keys added): written first, read from
  the keys that are not the record's own. A record has at most one, and then no ``extra``
  (the nested record keeps the keys nobody knows).
- A tagged record is a dataclass deriving from :class:`Tagged` that sets the class-level
  (``ClassVar``, not a field) ``kind`` (``kind: ClassVar[str] = "own"``; an event's ``kind``
  is its envelope's, not this): it is written with ``"kind": <its kind>`` first, and a
  field typed as a union of tagged records (``Bundled | Own``) is read as the member its
  ``kind`` key names; a missing or unknown kind is a ContractError naming the key and the
  kinds allowed. A union that also holds a mapping type (``dict[str, Any] | Changes``)
  reads an object without a ``kind`` as that mapping. A tagged record read directly refuses a ``kind`` other than its own.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import enum
import functools
import math
import types
import typing
from dataclasses import MISSING, field, fields
from typing import Any, Mapping, TypeVar

from .errors import ContractError

T = TypeVar("T")

JSON = "json"            # field metadata: the field's JSON name when it differs
OPTIONAL = "optional"    # field metadata: may be absent; written only when not None
EXTRA = "extra"          # the field that keeps the keys a record does not know
FLAT = "flat"            # field metadata: a nested record whose keys sit beside the record's
FLAG = "flag"            # field metadata: a bool written as 1 when true, left out when false
TAG = "kind"             # the class attribute, and JSON key, of a tagged record's kind
FILTERED = "filtered"    # field metadata: items not of the item type are left out on reading
NONFINITE = "NONFINITE"  # the class attribute that says how a record writes non-finite floats
AS_STRING = "string"     # "nan", "inf", "-inf" (records that do not say)
AS_NULL = "null"         # null


def opt(default: Any = None, *, json: str | None = None, factory: Any = None) -> Any:
    """An optional field: absent in a record reads as its default; None is not written."""
    meta = {OPTIONAL: True, **({JSON: json} if json else {})}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def req(*, json: str | None = None) -> Any:
    """A required field whose JSON name differs from the attribute (``class``)."""
    return field(metadata={JSON: json} if json else {})


def named(json: str, default: Any = MISSING) -> Any:
    """A field with a default whose JSON name differs from the attribute; None is written."""
    return field(default=default, metadata={JSON: json})


def filtered(default: Any = MISSING, *, factory: Any = None) -> Any:
    """A list, tuple or mapping field whose items not of the item type are left out on
    reading (module rules)."""
    if factory is not None:
        return field(default_factory=factory, metadata={FILTERED: True})
    return field(default=default, metadata={FILTERED: True})


def flag(*, json: str | None = None) -> Any:
    """A bool field, false by default, written as ``1`` when true and left out when false."""
    return field(default=False, metadata={FLAG: True, **({JSON: json} if json else {})})


def flat() -> Any:
    """A required nested record whose keys sit beside the record's own (module rules)."""
    return field(metadata={FLAT: True})


def json_name(f: dataclasses.Field) -> str:
    return f.metadata.get(JSON, f.name)


class Tagged:
    """The base of a tagged record (module rules): a subclass sets its ``kind``."""
    kind: typing.ClassVar[str] = ""


def tag_of(cls: Any) -> str | None:
    """A tagged record class's kind, else None."""
    if isinstance(cls, type) and issubclass(cls, Tagged) and cls.kind:
        return cls.kind
    return None


# --- encode ---------------------------------------------------------------------------------

def encode(value: Any, *, skip: tuple[str, ...] = ()) -> Any:
    """``value`` as JSON-safe data: a dataclass as its object (JSON names; a tagged record's
    ``kind`` first, then ``extra``; the attributes in ``skip`` left out, ``"kind"`` there
    leaves out the tag), enums as their values, tuples as lists, non-finite floats as
    strings (as null in a record whose ``NONFINITE`` says so)."""
    return _encode(value, skip, AS_STRING)


def _encode(value: Any, skip: tuple[str, ...], nonfinite: str) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        nonfinite = _nonfinite(type(value), nonfinite)
        out: dict[str, Any] = {}
        for f in fields(value):
            if f.name in skip:
                continue
            v = getattr(value, f.name)
            if f.name == EXTRA and isinstance(v, (Mapping, tuple)):
                pairs = v.items() if isinstance(v, Mapping) else v
                out = {**{str(k): _encode(x, (), nonfinite) for k, x in pairs}, **out}
                continue
            if f.metadata.get(FLAT):
                out = {**_encode(v, (), nonfinite), **out}
                continue
            if v is None and f.metadata.get(OPTIONAL):
                continue
            if f.metadata.get(FLAG):
                if v:
                    out[json_name(f)] = 1
                continue
            out[json_name(f)] = _encode(v, (), nonfinite)
        tag = tag_of(type(value))
        if tag is not None and TAG not in skip:
            out = {TAG: tag, **out}
        return out
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return None if nonfinite == AS_NULL else str(value)
    if isinstance(value, enum.Enum):
        return _encode(value.value, (), nonfinite)
    if isinstance(value, Mapping):
        return {str(k): _encode(v, (), nonfinite) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_encode(v, (), nonfinite) for v in value]
    return value


def _nonfinite(cls: type, around: str = AS_STRING) -> str:
    """How the record class ``cls`` writes non-finite floats: its ``NONFINITE``, else
    ``around`` (the spelling of the record it sits in)."""
    spelling = getattr(cls, NONFINITE, around)
    if spelling not in (AS_STRING, AS_NULL):
        raise TypeError(f"{cls.__name__}.{NONFINITE} is {spelling!r}, "
                        f"expected {AS_STRING!r} or {AS_NULL!r}")
    return spelling


# --- decode ---------------------------------------------------------------------------------

def decode(cls: type[T], obj: Any, *, what: str | None = None, tolerant: bool = False,
           at: tuple[str, ...] = (), **defaults: Any) -> T:
    """The record ``cls`` from its JSON object; ``defaults`` (attribute names) fill fields
    ``obj`` lacks (and, read ``tolerant``, fields it has mistyped). ``what`` names the
    record in errors (``"a checkpoint record"``), ``at`` the keys that lead from it to this
    (nested) record (an error names ``spec.json's 'identity.run_id'``); ``tolerant``: see
    the module's rules."""
    what = what or f"a {cls.__name__} record"
    if not isinstance(obj, Mapping):
        raise ContractError(f"{where(what, at)} is not a JSON object")
    tolerant = tolerant or getattr(cls, "TOLERANT", False) is True
    tag = tag_of(cls)
    if tag is not None and obj.get(TAG, tag) != tag:
        raise ContractError(f"{where(what, (*at, TAG))} is {obj.get(TAG)!r}, expected {tag!r}")
    hints = _hints(cls)
    kw: dict[str, Any] = {}
    known: set[str] = {TAG} if tag is not None else set()
    extra_field: dataclasses.Field | None = None
    flat_field: dataclasses.Field | None = None
    for f in fields(cls):  # type: ignore[arg-type]
        if not f.init:
            continue
        if f.name == EXTRA:
            extra_field = f
            continue
        if f.metadata.get(FLAT):
            flat_field = f
            continue
        key = json_name(f)
        known.add(key)
        if key in obj:
            try:
                is_flag = f.metadata.get(FLAG, False)
                value = _check(what, (*at, key), obj[key], FLAG_VALUE if is_flag else hints[f.name],
                               tolerant, f.metadata.get(FILTERED, False))
                kw[f.name] = bool(value) if is_flag else value
            except Mistyped:
                if tolerant and f.name in defaults:
                    kw[f.name] = defaults[f.name]
                elif not tolerant or (f.default is MISSING and f.default_factory is MISSING):
                    raise
                # else the dataclass gives the field its default
        elif f.name in defaults:
            kw[f.name] = defaults[f.name]
        elif f.default is MISSING and f.default_factory is MISSING:
            raise ContractError(f"{where(what, at)} lacks its {key!r} field")
    if getattr(cls, "CLOSED", False) is True:
        for k in obj:
            if k not in known:
                raise ContractError(f"{where(what, (*at, str(k)))} is unknown (known: "
                                    f"{', '.join(sorted(known - {TAG}))})")
    if flat_field is not None:
        rest = {k: v for k, v in obj.items() if k not in known}
        kw[flat_field.name] = decode(hints[flat_field.name], rest, what=what, at=at,
                                     tolerant=tolerant)
    elif extra_field is not None:
        rest = {k: v for k, v in obj.items() if k not in known}
        kw[EXTRA] = _unknown(what, rest, extra_field, hints[EXTRA], tolerant)
    return cls(**kw)


def _unknown(what: str, rest: dict[str, Any], f: dataclasses.Field, hint: Any,
             tolerant: bool) -> Any:
    """The keys a record does not know as its ``extra`` field holds them: a dict, or
    ``(key, value)`` pairs where the field is a tuple (module rules)."""
    pairs = (typing.get_origin(hint) or hint) is tuple
    if f.metadata.get(FILTERED):
        items = [[k, v] for k, v in rest.items()] if pairs else rest
        _, kept = coerce(items, hint, what, tolerant, filtered=True, at=(EXTRA,))
        return kept
    return tuple(rest.items()) if pairs else rest


#: what a :func:`flag` field's value may be
FLAG_VALUE = bool | int | None


class Mistyped(ContractError):
    """A field's value is not of the field's type (a nested record that does not read raises
    its own error, never this one)."""


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def where(what: str, at: tuple[str, ...]) -> str:
    """A place in a record for an error: ``spec.json``, ``spec.json's 'identity.run_id'``,
    ``state.json's 'attempts[2].n'`` (a list's index or a mapping's key in brackets)."""
    path = "".join(k if k.startswith("[") or i == 0 else f".{k}" for i, k in enumerate(at))
    return f"{what}'s {path!r}" if at else what


def _check(what: str, at: tuple[str, ...], value: Any, hint: Any, tolerant: bool = False,
           filtered: bool = False) -> Any:
    """``value`` as the field's type, or ContractError (one line, naming record and key)."""
    ok, out = coerce(value, hint, what, tolerant, filtered, at=at)
    if not ok:
        raise Mistyped(f"{where(what, at)} is {type(value).__name__} "
                       f"{_short(value)}, expected {type_name(hint)}")
    return out


def coerce(value: Any, hint: Any, what: str = "a value", tolerant: bool = False,
           filtered: bool = False, *, at: tuple[str, ...] = ()) -> tuple[bool, Any]:
    """(whether ``value`` is of type ``hint``, the value as that type). A nested record that
    does not read raises its own ContractError (``what`` and ``at`` name where it is);
    ``tolerant`` is passed to it. ``filtered``: a list, tuple or mapping keeps only its items
    of the item type (an item that raises is left out too)."""
    if hint is Any or hint is object:
        return True, value
    origin, hint_args, tagged = _shape(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in hint_args:    # the common ``X | None`` read
            return True, None
        if tagged and isinstance(value, Mapping):
            kind = value.get(TAG)
            if isinstance(kind, str) and kind in tagged:
                return True, decode(tagged[kind], value, what=what, at=at, tolerant=tolerant)
            untagged = tuple(a for a in hint_args if tag_of(a) is None)
            if kind is not None or not any(_is_mapping(a) for a in untagged):
                raise Mistyped(f"{where(what, (*at, TAG))} is {kind!r}, expected one "
                               f"of {', '.join(tagged)}")
            hint_args = untagged     # a mapping without a kind: the union's mapping type
        err: ContractError | None = None
        for arg in hint_args:
            try:
                ok, out = coerce(value, arg, what, tolerant, filtered, at=at)
            except ContractError as e:
                err = err or e
                continue
            if ok:
                return True, out
        if err is not None:
            raise err
        return False, value
    if hint is type(None):
        return value is None, value
    if origin is typing.Literal:
        return value in hint_args, value
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        try:
            return True, hint(value)
        except ValueError:
            return False, value
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
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        if not isinstance(value, Mapping):
            return False, value
        return True, decode(hint, value, what=what, at=at, tolerant=tolerant)
    if hint in (list, tuple) or origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            return False, value
        args = hint_args
        fixed = (origin or hint) is tuple and bool(args) and Ellipsis not in args
        if fixed and len(value) != len(args):
            return False, value
        kinds = list(args) if fixed else [args[0] if args else Any] * len(value)
        items = []
        for n, (x, kind) in enumerate(zip(value, kinds, strict=True)):
            ok, y = _item(x, kind, what, tolerant, filtered and not fixed, (*at, f"[{n}]"))
            if ok:
                items.append(y)
            elif not (filtered and not fixed):
                return False, value
        return True, (tuple(items) if (origin or hint) is tuple else items)
    if hint in (dict, Mapping) or origin in (dict, collections.abc.Mapping):
        if not isinstance(value, Mapping):
            return False, value
        kv = hint_args
        if not kv or kv[1] is Any:
            return True, dict(value)
        res = {}
        for k, x in value.items():
            ok, y = _item(x, kv[1], what, tolerant, filtered, (*at, f"[{k}]"))
            if ok:
                res[k] = y
            elif not filtered:
                return False, value
        return True, res
    raise TypeError(f"unsupported field type {hint!r}")


def _is_mapping(hint: Any) -> bool:
    return hint in (dict, Mapping) or typing.get_origin(hint) in (dict, collections.abc.Mapping)


@functools.lru_cache(maxsize=None)
def _shape(hint: Any) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    """A type's origin, its arguments and, for a union, its tagged records by kind (looked up
    once per type: every record read asks again)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    tagged = ({t: a for a in args if (t := tag_of(a)) is not None}
              if origin in (typing.Union, types.UnionType) else {})
    return origin, args, tagged


def _item(value: Any, hint: Any, what: str, tolerant: bool, filtered: bool,
          at: tuple[str, ...]) -> tuple[bool, Any]:
    """One item of a list, tuple or mapping; of a ``filtered`` one, an item that raises is
    not of the type."""
    if not filtered:
        return coerce(value, hint, what, tolerant, at=at)
    try:
        return coerce(value, hint, what, tolerant, at=at)
    except ContractError:
        return False, value


def type_name(hint: Any) -> str:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " or ".join(type_name(a) for a in typing.get_args(hint))
    if hint is type(None):
        return "null"
    return getattr(hint, "__name__", str(hint))


def _short(value: Any) -> str:
    s = repr(value)
    return s if len(s) <= 40 else s[:37] + "..."
