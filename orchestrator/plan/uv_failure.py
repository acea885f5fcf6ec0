"""What uv's error output says went wrong, pure: the line that names the cause and, when uv
could not use a Python interpreter, which one it tried. uv prints its error first and its
causes after it, and an interpreter it queried adds that interpreter's own stderr last, so
the last line is often a fragment of someone else's advice (pyenv's "... to be found at the
same time."). ``plan.uv.translate_uv_error`` turns a :class:`UvFailure` into the one line."""

from __future__ import annotations

import re
from dataclasses import dataclass

VERSION = 1

_INSPECT = re.compile(r"Failed to inspect Python interpreter from (?P<origin>.+?) at `(?P<path>[^`]+)`")
_QUERY = re.compile(r"Querying Python at `(?P<path>[^`]+)` failed with exit status "
                    r"(?:exit status: )?(?P<code>-?\d+)")
_NOT_FOUND = re.compile(r"No interpreter found for (?P<want>.+?) in (?P<where>.+)$")
_PREFIX = re.compile(r"^(?:error|cause|caused by|warning):\s*", re.I)


@dataclass(frozen=True)
class UvFailure:
    """``kind``: ``interpreter_broken`` (uv found an interpreter that does not run),
    ``no_interpreter`` (none matches the request) or ``other``. ``cause``: the line that
    says why; ``interpreter``: the path uv tried (or the request it could not meet);
    ``origin``: where uv took it from; ``said``: the interpreter's own first stderr line."""

    kind: str
    cause: str
    interpreter: str = ""
    origin: str = ""
    exit_code: int | None = None
    said: str = ""
    version: int = VERSION


def _stderr_first(lines: list[str]) -> str:
    """The first non-empty line after uv's ``[stderr]`` marker."""
    for i, ln in enumerate(lines):
        if ln.strip() == "[stderr]":
            for rest in lines[i + 1:]:
                if rest.strip():
                    return rest.strip()
    return ""


def classify_uv_failure(text: str) -> UvFailure:
    lines = text.splitlines()
    # uv wraps a long message (a long interpreter path) onto indented lines: match it whole
    flat = " ".join(ln.strip() for ln in lines)
    m = _INSPECT.search(flat)
    q = _QUERY.search(flat)
    hit = q or m
    if hit:
        path = hit.group("path")
        return UvFailure("interpreter_broken",
                         cause=hit.group(0),
                         interpreter=path, origin=m.group("origin") if m else "",
                         exit_code=int(q.group("code")) if q else None,
                         said=_stderr_first(lines))
    for ln in lines:
        n = _NOT_FOUND.search(ln)
        if n:
            return UvFailure("no_interpreter", cause=_PREFIX.sub("", ln.strip()),
                             interpreter=n.group("want"), origin=n.group("where"))
    return UvFailure("other", cause=cause_line(lines))


def cause_line(lines: list[str]) -> str:
    """uv's deepest ``cause:`` line, else its ``error:`` line, else the last line."""
    stripped = [ln.strip() for ln in lines if ln.strip()]
    for prefix in ("caused by:", "cause:", "error:"):
        hits = [ln for ln in stripped if ln.lower().startswith(prefix)]
        if hits:
            return _PREFIX.sub("", hits[-1])
    return stripped[-1] if stripped else "no output"
