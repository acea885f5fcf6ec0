"""Read a growing file by byte offset, one complete line at a time.

Shared by the supervisor (watching an attempt's log) and ``follow`` (streaming a run's
files to ``dfo logs``). The caller keeps the offset, so a restarted reader loses and
repeats nothing. A line is only returned once its newline is in the file, so a line
written in two pieces (or a UTF-8 character split across two writes) is never cut;
``final=True`` (the writer is gone) also returns a last line that has no newline.
"""

from __future__ import annotations

import os
from typing import NamedTuple


class Line(NamedTuple):
    text: str   # without its newline; invalid UTF-8 becomes U+FFFD
    end: int    # byte offset just after the line (and its newline): where to resume


def read_lines(path: str | os.PathLike, offset: int = 0, *,
               final: bool = False) -> tuple[list[Line], int]:
    """The complete lines of ``path`` from byte ``offset`` on, and the new offset.

    A missing or unreadable file reads as empty (the writer has not created it yet).
    """
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except OSError:
        return [], offset
    if not data:
        return [], offset
    cut = data.rfind(b"\n") + 1
    body = data if final else data[:cut]
    out: list[Line] = []
    pos = offset
    start = 0
    while start < len(body):
        nl = body.find(b"\n", start)
        stop = len(body) if nl < 0 else nl
        pos += stop - start + (0 if nl < 0 else 1)
        out.append(Line(body[start:stop].decode("utf-8", "replace"), pos))
        start = stop + 1
    return out, offset + len(body)
