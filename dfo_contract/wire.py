"""What ``python -m orchestrator.supervisor.follow`` sends to ``dfo logs``: one JSON object
a line, each one of the records below (docs/contracts.md, "The follow wire").

- :class:`Line` ``{"f": "attempt-2.log", "o": 1234, "l": "text"}``: one complete line of
  file ``f``; ``o`` is the byte offset just after it (the reader restarts from there).
  ``"r": 1`` (optional) on the first line of a file that shrank below the reader's offset
  (emptied, rewritten): the file is read again from its start, so ``o`` starts over.
- :class:`End` ``{"end": "done"|"failed"|"stopped"|"lost"|"never_started"}``: following,
  the run ended (or never started) and every file was read to its end.
- :class:`Eof` ``{"eof": true, "status": ...}``: not following, everything present was sent.
- :class:`Keepalive` ``{"k": 1}``: following, nothing else to send for a while.
- :class:`Error` ``{"error": "..."}``: the follower cannot follow (no such run directory).

Each record is a dataclass read and written by ``dfo_contract.codec``: its fields' JSON names
are the short keys above; ``eof`` and ``k`` are constant fields that name their record.

The other direction: the follower's ``--offsets`` argument, ``{"<file>": <offset>, ...}``
(``encode_offsets`` / ``decode_offsets``), where to resume each file.

Version: a record without ``v`` is version 1 (the follower writes none at version 1; a
later version writes ``v``); any other ``v`` raises ``VersionError``. A line that is not
one of these records (a traceback, a torn line, a newer record type, a field of the wrong
type) decodes as None: the reader ignores it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Literal, Union

from . import codec
from .codec import flag, req
from .errors import ContractError, VersionError

VERSION = 1

#: ``End.status`` of a run directory whose supervisor never started (launch was cut off)
NEVER_STARTED = "never_started"
#: ``End.status`` of a run whose supervisor is gone without a final state
LOST = "lost"


@dataclass(frozen=True)
class Line:
    file: str = req(json="f")
    offset: int = req(json="o")
    text: str = req(json="l")
    restart: bool = flag(json="r")     # the file shrank and is read again from its start


@dataclass(frozen=True)
class End:
    status: str = req(json="end")


@dataclass(frozen=True)
class Eof:
    #: the key that names the record (written, never read back)
    eof: Literal[True] = field(default=True, init=False, repr=False, compare=False)
    status: str | None


@dataclass(frozen=True)
class Keepalive:
    #: the key that names the record (written, never read back)
    k: Literal[1] = field(default=1, init=False, repr=False, compare=False)


@dataclass(frozen=True)
class Error:
    message: str = req(json="error")


Record = Union[Line, End, Eof, Keepalive, Error]

#: each record by the key that names it, in the order a line is matched
_BY_KEY: tuple[tuple[str, type[Record]], ...] = (
    ("f", Line), ("end", End), ("eof", Eof), ("error", Error), ("k", Keepalive))


def encode(rec: Record) -> str:
    """The record as one line of JSON (no newline)."""
    if not isinstance(rec, (Line, End, Eof, Keepalive, Error)):
        raise ContractError(f"{type(rec).__name__} is not a follow wire record")
    return json.dumps(codec.encode(rec), separators=(",", ":"))


def decode(raw: str | bytes) -> Record | None:
    """The record of one line; None for a line that is not a follower record."""
    try:
        obj = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(obj, dict):
        return None
    v = obj.get("v", VERSION)
    if v != VERSION:
        raise VersionError(f"a follow record of version {v!r}: this dfo reads version "
                           f"{VERSION}")
    cls = next((c for key, c in _BY_KEY if key in obj), None)
    if cls is None:
        return None
    try:   # a Line without ``l`` is an empty line, an Eof without ``status`` has none
        return codec.decode(cls, obj, what="a follow record", text="", status=None)
    except ContractError:
        return None


def encode_offsets(offsets: dict[str, int]) -> str:
    """The follower's ``--offsets`` argument: where to resume each file."""
    return json.dumps({str(k): int(v) for k, v in offsets.items()}, sort_keys=True)


def decode_offsets(text: str) -> dict[str, int]:
    """``--offsets`` as a dict; ContractError when it is not ``{"<file>": <int>, ...}``."""
    try:
        obj = json.loads(text)
        if not isinstance(obj, dict):
            raise TypeError("not an object")
        return {str(k): int(v) for k, v in obj.items()}
    except (ValueError, TypeError) as e:
        raise ContractError(f"--offsets is not a JSON object of file offsets: {e}") from None
