"""The ``@dfo`` output-marker format and the "last JSON line" reply parser.

The trainer (and every helper the orchestrator runs remotely) prints machine-readable
records as one line each: ``@dfo {"kind": ...}``. Human text may surround them. Each
marker is written with a single ``write`` so ranks sharing a pipe never interleave.
"""

from __future__ import annotations

import json
from typing import Any, Iterable

from .fsio import json_object

PREFIX = "@dfo "


def format_marker(rec: dict[str, Any]) -> str:
    """One marker line (with its newline). Non-finite floats must be cleaned first."""
    return PREFIX + json.dumps(rec, allow_nan=False, default=str) + "\n"


def parse_marker(line: str) -> dict[str, Any] | None:
    """The record of a marker line, or None when the line is not a (well-formed) marker."""
    s = line.strip()
    if not s.startswith(PREFIX.strip()):
        return None
    return json_object(s[len(PREFIX.strip()):].strip())


def iter_markers(lines: Iterable[str]) -> Iterable[dict[str, Any]]:
    for ln in lines:
        rec = parse_marker(ln)
        if rec is not None:
            yield rec


def last_json_line(text: str) -> Any:
    """The last line of ``text`` that parses as JSON (a remote helper's reply), or None.

    Helpers print their one JSON reply last; anything before it (warnings, uv's chatter)
    is ignored.
    """
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if not line:
            continue
        try:
            return json.loads(line)
        except ValueError:
            continue
    return None
