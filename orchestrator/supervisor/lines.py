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


class CompleteLine(NamedTuple):
    text: str   # without its newline; invalid UTF-8 becomes U+FFFD
    end: int    # byte offset just after the line (and its newline): where to resume


def read_lines(path: str | os.PathLike, offset: int = 0, *, final: bool = False,
               cr: bool = False, max_chars: int | None = None) -> tuple[list[CompleteLine], int]:
    """The complete lines of ``path`` from byte ``offset`` on, and the new offset.

    A missing or unreadable file reads as empty (the writer has not created it yet).
    ``cr``: a lone ``\r`` ends a line too (a progress bar's updates; ``\r\n`` is one end).
    ``max_chars``: a longer line's text is cut there, with how much was left out.
    """
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except OSError:
        return [], offset
    if not data:
        return [], offset
    if cr:
        last = len(data) - 1 if data.endswith(b"\r") else len(data)   # a last \r's \n
        cut = max(data.rfind(b"\n", 0, last), data.rfind(b"\r", 0, last)) + 1  # may follow
    else:
        cut = data.rfind(b"\n") + 1
    body = data if final else data[:cut]
    out: list[CompleteLine] = []
    pos = offset
    start = 0
    while start < len(body):
        nl = body.find(b"\n", start)
        if cr:
            r = body.find(b"\r", start)
            if 0 <= r < (nl if nl >= 0 else len(body)) and not (r + 1 == nl):
                nl = r
        stop = len(body) if nl < 0 else nl
        end = stop + (0 if nl < 0 else 1)
        text_stop = stop - 1 if cr and stop > start and body[stop - 1:stop] == b"\r" \
            and nl >= 0 and body[nl:nl + 1] == b"\n" else stop
        pos += end - start
        if not (cr and stop == start and body[stop:stop + 1] == b"\r"):   # not a bare \r
            text = body[start:text_stop].decode("utf-8", "replace")
            out.append(CompleteLine(_cap(text, max_chars), pos))
        start = end
    return out, offset + len(body)


def _cap(text: str, max_chars: int | None) -> str:
    if max_chars is None or len(text) <= max_chars:
        return text
    return f"{text[:max_chars]} ... ({len(text) - max_chars} more characters)"
