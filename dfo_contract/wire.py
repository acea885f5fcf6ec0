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

The other direction: the follower's ``--offsets`` argument, ``{"<file>": <offset>, ...}``
(``encode_offsets`` / ``decode_offsets``), where to resume each file.

Version: a record without ``v`` is version 1 (the follower writes none at version 1; a
later version writes ``v``); any other ``v`` raises ``VersionError``. A line that is not
one of these records (a traceback, a torn line, a newer record type) decodes as None: the
reader ignores it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Union

from .errors import ContractError, VersionError

VERSION = 1

#: ``End.status`` of a run directory whose supervisor never started (launch was cut off)
NEVER_STARTED = "never_started"
#: ``End.status`` of a run whose supervisor is gone without a final state
LOST = "lost"


@dataclass(frozen=True)
class Line:
    file: str
    offset: int
    text: str
    restart: bool = False     # the file shrank and is read again from its start


@dataclass(frozen=True)
class End:
    status: str


@dataclass(frozen=True)
class Eof:
    status: str | None


@dataclass(frozen=True)
class Keepalive:
    pass


@dataclass(frozen=True)
class Error:
    message: str


Record = Union[Line, End, Eof, Keepalive, Error]


def encode(rec: Record) -> str:
    """The record as one line of JSON (no newline)."""
    if isinstance(rec, Line):
        obj: dict[str, Any] = {"f": rec.file, "o": rec.offset, "l": rec.text}
        if rec.restart:
            obj["r"] = 1
    elif isinstance(rec, End):
        obj = {"end": rec.status}
    elif isinstance(rec, Eof):
        obj = {"eof": True, "status": rec.status}
    elif isinstance(rec, Keepalive):
        obj = {"k": 1}
    elif isinstance(rec, Error):
        obj = {"error": rec.message}
    else:
        raise ContractError(f"{type(rec).__name__} is not a follow wire record")
    return json.dumps(obj, separators=(",", ":"))


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
    if "f" in obj:
        try:
            return Line(str(obj["f"]), int(obj["o"]), str(obj.get("l", "")),
                        bool(obj.get("r")))
        except (KeyError, TypeError, ValueError):
            return None
    if "end" in obj:
        return End(str(obj["end"]))
    if "eof" in obj:
        s = obj.get("status")
        return Eof(None if s is None else str(s))
    if "error" in obj:
        return Error(str(obj["error"]))
    if "k" in obj:
        return Keepalive()
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
